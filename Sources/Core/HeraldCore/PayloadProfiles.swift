// The fields each payload profile adds (compact, Sendbird, CometChat), shared by the providers' payloads.

import Foundation

extension Renderer {
    static func writeCompact(_ event: ChatEvent, _ recipient: String, into w: inout JSONWriter) {
        w.byte(UInt8(ascii: ","))
        writeCompactIDs(event, recipient, into: &w)
        if let call = event.call { writeCallObject(call, into: &w) }
        if let action = messageAction(event) { w.raw(",\"action\":"); w.string(action) }
    }

    /// The compact profile's ids, `"f":sender,"t":recipient`, then `"m":message` (a reaction's message) and
    /// `"g":conversation` of a group, as APNs payloads and FCM `data` both carry them.
    static func writeCompactIDs(_ event: ChatEvent, _ recipient: String, into w: inout JSONWriter) {
        w.raw("\"f\":"); w.string(event.sender.id)
        w.raw(",\"t\":"); w.string(recipient)
        if let m = event.message {
            w.raw(",\"m\":"); w.string(m.id)
        } else if let id = event.reaction?.messageID {
            w.raw(",\"m\":"); w.string(id)
        }
        if event.conversation.type == .group { w.raw(",\"g\":"); w.string(event.conversation.id) }
    }

    /// `edited` or `deleted` for the message-change kinds, else nil (docs/behaviour.md §7).
    static func messageAction(_ event: ChatEvent) -> String? {
        switch event.kind {
        case .messageEdited: return "edited"
        case .messageDeleted: return "deleted"
        default: return nil
        }
    }

    static func writeCallObject(_ call: ChatEvent.Call, into w: inout JSONWriter) {
        w.raw(",\"call\":{\"action\":"); w.string(call.action.rawValue)
        w.raw(",\"session_id\":"); w.string(call.sessionID)
        w.raw(",\"type\":"); w.string(call.type.rawValue)
        w.byte(UInt8(ascii: "}"))
    }

    /// A message id as a JSON number when it is a decimal integer (Sendbird's
    /// `message_id` is a long), else as a string.
    static func writeID(_ id: String, into w: inout JSONWriter) {
        if let n = Int64(id), String(n) == id { w.int(n) } else { w.string(id) }
    }

    static func writeSendbird(
        _ event: ChatEvent, _ recipient: String, _ state: UserState, _ sender: String,
        _ content: PayloadContent, key: String, _ options: PayloadOptions, into w: inout JSONWriter
    ) {
        w.byte(UInt8(ascii: ",")); w.key(key)
        writeSendbirdObject(event, recipient, state, sender, content, options, into: &w)
    }

    /// The Sendbird object itself (`{"category":"messaging:offline_notification",...}`).
    static func writeSendbirdObject(
        _ event: ChatEvent, _ recipient: String, _ state: UserState, _ sender: String,
        _ content: PayloadContent, _ options: PayloadOptions = PayloadOptions(),
        into w: inout JSONWriter
    ) {
        let m = event.message
        w.raw("{\"category\":\"messaging:offline_notification\",\"type\":")
        switch m?.type {
        case .file: w.raw(options.sendbirdV3TypeCodes ? "\"FILE\"" : "\"File\"")
        case .admin: w.raw(options.sendbirdV3TypeCodes ? "\"ADMM\"" : "\"Admin\"")
        default: w.raw(options.sendbirdV3TypeCodes ? "\"MESG\"" : "\"User\"")
        }
        w.raw(",\"message\":"); w.string(m != nil ? content.detailText : content.body)
        w.raw(",\"data\":"); w.string(content.data)
        w.raw(",\"custom_type\":"); w.string(m?.customType ?? "")
        if let m {
            w.raw(",\"message_id\":"); writeID(m.id, into: &w)
        } else if let id = event.reaction?.messageID {
            w.raw(",\"message_id\":"); writeID(id, into: &w)
        }
        if let t = event.createdAt { w.raw(",\"created_at\":"); w.int(t) }
        w.raw(",\"app_id\":"); w.string(event.appID)
        w.raw(",\"unread_message_count\":"); w.int(state.unread.total)
        w.raw(",\"channel\":{\"channel_url\":"); w.string(event.conversation.id)
        w.raw(",\"name\":"); w.string(event.conversation.name ?? "")
        w.raw(",\"custom_type\":"); w.string(event.conversation.customType ?? "")
        w.raw("},\"channel_type\":")
        if let channelType = event.conversation.channelType {
            w.string(channelType)
        } else if event.conversation.type == .direct {
            w.raw("\"messaging\"")
        } else {
            w.string(options.sendbirdGroupChannelType)
        }
        w.raw(",\"sender\":{\"id\":"); w.string(event.sender.id)
        w.raw(",\"name\":"); w.string(sender)
        w.raw(",\"profile_url\":"); w.string(event.sender.profileURL ?? "")
        w.raw("},\"recipient\":{\"id\":"); w.string(recipient)
        w.raw(",\"name\":"); w.string(state.preferences.nickname ?? state.preferences.displayName ?? "")
        w.raw("},\"files\":[")
        if let f = m?.file {
            w.raw("{\"name\":"); w.string(f.name ?? "")
            w.raw(",\"type\":"); w.string(f.mimeType ?? "")
            w.raw(",\"url\":"); w.string(f.url ?? "")
            w.byte(UInt8(ascii: "}"))
        }
        w.raw("],\"translations\":{")
        for (n, pair) in content.translations.enumerated() {
            if n > 0 { w.byte(UInt8(ascii: ",")) }
            w.key(pair.0); w.string(pair.1)
        }
        w.raw("},\"push_sound\":")
        // `em_push_sound: null` silences the push: no sound name.
        w.string(
            event.ext.apns.soundSilenced
                ? "" : event.ext.apns.sound ?? options.sound(conversation: event.conversation.id))
        if options.sendbirdPushTitle { w.raw(",\"push_title\":"); w.string(content.title ?? "") }
        if options.sendbirdPushAlert { w.raw(",\"push_alert\":"); w.string(content.body) }
        if let audience = options.sendbirdAudienceType {
            w.raw(",\"audience_type\":"); w.string(audienceType(event, recipient: recipient) ?? audience)
        }
        if options.sendbirdMentionedUsers, m?.mentions.contains(recipient) == true {
            // The mention counts are Herald's when the app counts (docs/behaviour.md §12), else 0.
            w.raw(",\"mentioned_users\":{\"user_id\":"); w.string(recipient)
            w.raw(",\"total_unread_mention_count\":"); w.int(state.unread.mentionTotal)
            // The number of conversations holding an unread mention of the user (the seed's meaning).
            w.raw(",\"channel_unread_mention_count\":")
            w.int(state.unread.mentionedConversations)
            w.raw(",\"is_hidden\":"); w.bool(event.conversation.hiddenBy.contains(recipient))
            w.byte(UInt8(ascii: "}"))
        }
        if let action = messageAction(event) { w.raw(",\"message_action\":"); w.string(action) }
        if options.sendbirdChannelUnreadCount {
            w.raw(",\"channel_unread_count\":"); w.int(state.unread.conversations[event.conversation.id] ?? 0)
        }
        if let call = event.call { writeCallObject(call, into: &w) }
        w.byte(UInt8(ascii: "}"))
    }

    /// CometChat's flat fields. `messageAsString`: the `message` object written as a JSON string (FCM `data`,
    /// whose values are strings) and `custom` left out.
    static func writeCometChat(
        _ event: ChatEvent, _ recipient: String, _ state: UserState, _ sender: String,
        _ content: PayloadContent, _ options: PayloadOptions = PayloadOptions(), messageAsString: Bool = false,
        into w: inout JSONWriter
    ) {
        let isGroup = event.conversation.type == .group
        w.raw(",\"title\":"); w.string(content.title ?? sender)
        w.raw(",\"body\":"); w.string(content.body)
        w.raw(",\"sender\":"); w.string(event.sender.id)
        w.raw(",\"senderName\":"); w.string(sender)
        if let p = event.sender.profileURL { w.raw(",\"senderAvatar\":"); w.string(p) }
        w.raw(",\"receiver\":"); w.string(isGroup ? event.conversation.id : recipient)
        if isGroup, let n = event.conversation.name {
            w.raw(",\"receiverName\":"); w.string(n)
        } else if !isGroup, let n = state.preferences.nickname ?? state.preferences.displayName {
            w.raw(",\"receiverName\":"); w.string(n)
        }
        if let avatar = event.conversation.avatarURL { w.raw(",\"receiverAvatar\":"); w.string(avatar) }
        w.raw(",\"receiverType\":"); w.raw(isGroup ? "\"group\"" : "\"user\"")
        let tag: String
        switch event.kind {
        case .message, .messageEdited, .messageDeleted: tag = event.message?.id ?? event.eventID
        case .reaction: tag = event.reaction?.messageID ?? event.message?.id ?? event.eventID
        case .groupAction, .conversationRead: tag = event.conversation.id
        case .call: tag = event.message?.id ?? event.call?.sessionID ?? event.eventID
        }
        w.raw(",\"tag\":"); w.string(tag)
        w.raw(",\"conversationId\":"); w.string(event.conversation.id)
        w.raw(",\"type\":"); w.raw(event.kind == .call ? "\"call\"" : "\"chat\"")
        if let call = event.call {
            w.raw(",\"callAction\":"); w.string(call.action.rawValue)
            w.raw(",\"sessionId\":"); w.string(call.sessionID)
            w.raw(",\"callType\":"); w.string(call.type.rawValue)
        }
        if let t = event.createdAt { w.raw(",\"sentAt\":\""); w.int(t); w.byte(UInt8(ascii: "\"")) }
        if let action = messageAction(event) { w.raw(",\"messageAction\":"); w.string(action) }
        if options.cometchatIncludeMessage, let m = event.message {
            w.raw(",\"message\":")
            if messageAsString {
                var o = JSONWriter(capacity: 512)
                writeCometChatMessage(event, m, recipient, state, sender, content, into: &o)
                w.string(o.string)
            } else {
                writeCometChatMessage(event, m, recipient, state, sender, content, into: &w)
            }
        }
        if !messageAsString, let custom = options.cometchatCustom { w.raw(",\"custom\":"); w.value(custom) }
    }

    /// CometChat's message object ("Include message object"): the message with its sender and receiver, and in
    /// `data` its text, metadata and attachments (the `file` first, then `attachments`). `text` and `url` are also
    /// kept at the top, where older clients read them.
    static func writeCometChatMessage(
        _ event: ChatEvent, _ m: ChatEvent.Message, _ recipient: String, _ state: UserState, _ sender: String,
        _ content: PayloadContent, into w: inout JSONWriter
    ) {
        let isGroup = event.conversation.type == .group
        let files = (m.file.map { [$0] } ?? []) + (content.messageExtrasDropped ? [] : m.attachments)
        let type = m.type == .file ? fileCategory(files.first?.mimeType) : "text"
        w.raw("{\"id\":"); w.string(m.id)
        w.raw(",\"conversationId\":"); w.string(event.conversation.id)
        w.raw(",\"sender\":"); w.string(event.sender.id)
        w.raw(",\"receiver\":"); w.string(isGroup ? event.conversation.id : recipient)
        w.raw(",\"receiverType\":"); w.raw(isGroup ? "\"group\"" : "\"user\"")
        w.raw(",\"category\":\"message\",\"type\":"); w.string(type)
        w.raw(",\"text\":"); w.string(content.detailText)
        if let url = files.first?.url { w.raw(",\"url\":"); w.string(url) }
        w.raw(",\"data\":{\"text\":"); w.string(content.detailText)
        if !content.messageExtrasDropped, let metadata = m.metadata { w.raw(",\"metadata\":"); w.value(metadata) }
        if !files.isEmpty {
            w.raw(",\"attachments\":[")
            for (n, f) in files.enumerated() {
                if n > 0 { w.byte(UInt8(ascii: ",")) }
                w.raw("{\"name\":"); w.string(f.name ?? "")
                w.raw(",\"mimeType\":"); w.string(f.mimeType ?? "")
                w.raw(",\"extension\":"); w.string(fileExtension(f.name))
                w.raw(",\"url\":"); w.string(f.url ?? "")
                w.byte(UInt8(ascii: "}"))
            }
            w.byte(UInt8(ascii: "]"))
        }
        w.raw(",\"entities\":{\"sender\":{\"entityType\":\"user\",\"entity\":{\"uid\":"); w.string(event.sender.id)
        w.raw(",\"name\":"); w.string(sender)
        if let avatar = event.sender.profileURL { w.raw(",\"avatar\":"); w.string(avatar) }
        w.raw("}},\"receiver\":{\"entityType\":"); w.raw(isGroup ? "\"group\"" : "\"user\"")
        w.raw(",\"entity\":{"); w.raw(isGroup ? "\"guid\":" : "\"uid\":")
        w.string(isGroup ? event.conversation.id : recipient)
        if let name = isGroup ? event.conversation.name : state.preferences.nickname ?? state.preferences.displayName {
            w.raw(",\"name\":"); w.string(name)
        }
        if let avatar = event.conversation.avatarURL {
            w.raw(isGroup ? ",\"icon\":" : ",\"avatar\":"); w.string(avatar)
        }
        w.raw("}}}}")
        if let t = event.createdAt {
            w.raw(",\"sentAt\":"); w.int(t / 1000)
            switch event.kind {
            case .messageEdited: w.raw(",\"editedAt\":"); w.int(t / 1000)
            case .messageDeleted: w.raw(",\"deletedAt\":"); w.int(t / 1000)
            default: break
            }
        }
        w.byte(UInt8(ascii: "}"))
    }

    /// A file name's extension, lower case, or "" when it has none.
    static func fileExtension(_ name: String?) -> String {
        guard let name, let dot = name.lastIndex(of: "."), dot != name.startIndex else { return "" }
        let ext = name[name.index(after: dot)...]
        return ext.isEmpty || ext.utf8.count > 16 ? "" : ext.lowercased()
    }

    /// Sendbird's `audience_type` of one push, where the event says enough: `all` when the message mentions the
    /// whole channel, `only` when it names the recipient among its mentions; nil otherwise (the app's configured
    /// value is written).
    static func audienceType(_ event: ChatEvent, recipient: String) -> String? {
        guard let m = event.message, event.kind == .message || event.kind == .messageEdited else { return nil }
        if m.mentionType == .channel { return "all" }
        if m.mentions.contains(recipient) { return "only" }
        return nil
    }

    /// CometChat's media message types by mime type.
    static func fileCategory(_ mime: String?) -> String {
        let m = (mime ?? "").lowercased()
        if m.hasPrefix("image/") { return "image" }
        if m.hasPrefix("video/") { return "video" }
        if m.hasPrefix("audio/") { return "audio" }
        return "file"
    }
}
