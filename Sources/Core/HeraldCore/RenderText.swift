// The texts of a notification: sender name, body from templates and catalogs, translation.

import Foundation

extension Renderer {
    /// The sender's name as shown: push display name, else nickname, else id.
    static func senderName(_ event: ChatEvent, _ displayName: String?) -> String {
        if let d = displayName, !d.isEmpty { return d }
        if let n = event.sender.name, !n.isEmpty { return n }
        return event.sender.id
    }

    /// The message text in the recipient's language: the translation into the
    /// first preferred language when the message language is not preferred.
    static func displayText(_ m: ChatEvent.Message, languages: [String]) -> String {
        guard let first = languages.first, !m.translations.isEmpty else { return m.text }
        if isInPreferredLanguage(m, languages: languages) { return m.text }
        return m.translation(first) ?? m.text
    }

    /// Whether the message is written in one of the preferred languages (its tag, or a tag whose primary subtag it
    /// is): then its text is shown as written, and no translation is asked for (`Translation.missingLanguage`).
    static func isInPreferredLanguage(_ m: ChatEvent.Message, languages: [String]) -> Bool {
        guard let lang = m.language else { return false }
        let l = Language.normalize(lang)
        return languages.contains { Language.normalize($0) == l || Language.primary($0) == l }
    }

    static func fileTypeFriendly(_ mime: String?, _ strings: Strings) -> String {
        let m = (mime ?? "").lowercased()
        if m.hasPrefix("image/") { return strings[.fileImage].source }
        if m.hasPrefix("video/") { return strings[.fileVideo].source }
        if m.hasPrefix("audio/") { return strings[.fileAudio].source }
        return strings[.fileOther].source
    }

    /// The alert body (before `em_push_content`, which the caller applies).
    public static func body(
        event: ChatEvent, preferences: Preferences, app: AppConfig,
        senderDisplayName: String?
    ) -> String {
        let strings = app.strings(for: preferences.languages)
        let sender = senderName(event, senderDisplayName)
        switch event.kind {
        case .call:
            switch event.call?.action {
            case .unanswered?, .cancelled?: return strings[.callMissed].source
            case .ongoing?: return strings[.callOngoing].source
            case .rejected?: return strings[.callRejected].source
            case .ended?: return strings[.callEnded].source
            case .busy?: return strings[.callBusy].source
            case .initiated?, nil: return strings[event.call?.type == .video ? .callVideo : .callAudio].source
            }
        case .reaction:
            let emoji = event.reaction?.emoji ?? ""
            return strings[.reaction].render { $0 == .emoji ? emoji : variable($0, event, sender, "", strings) }
        case .groupAction:
            guard let g = event.groupAction else { return "" }
            let key: CatalogKey
            switch g.action {
            case .joined: key = .groupJoined
            case .left: key = .groupLeft
            case .added: key = .groupAdded
            case .removed: key = .groupRemoved
            case .banned: key = .groupBanned
            case .unbanned: key = .groupUnbanned
            }
            return strings[key].render { $0 == .actorName ? g.actorName : variable($0, event, sender, "", strings) }
        case .messageDeleted, .conversationRead:
            return ""
        case .message, .messageEdited:
            guard let m = event.message else { return "" }
            let text = displayText(m, languages: preferences.languages)
            if m.type == .admin { return text }
            if preferences.displayStyle == .simpleBanner { return strings[.simpleBanner].source }
            let isFile = m.type == .file
            let template: Template
            if let ct = event.conversation.customType, !ct.isEmpty, let custom = app.customTemplates[ct] {
                template = isFile ? custom.file : custom.text
            } else if !m.customType.isEmpty, let custom = app.customTemplates[m.customType] {
                template = isFile ? custom.file : custom.text
            } else if preferences.template == .alternative {
                template = strings[isFile ? .alternativeFile : .alternativeText]
            } else {
                template = strings[isFile ? .defaultFile : .defaultText]
            }
            return template.render { variable($0, event, sender, text, strings) }
        }
    }

    static func variable(
        _ v: TemplateVariable, _ event: ChatEvent, _ sender: String, _ text: String,
        _ strings: Strings
    ) -> String {
        switch v {
        case .count, .conversationCount: return ""
        case .senderName: return sender
        case .message: return text
        case .filename: return event.message?.file?.name ?? ""
        case .channelName: return event.conversation.name ?? ""
        case .fileTypeFriendly: return fileTypeFriendly(event.message?.file?.mimeType, strings)
        case .emoji: return event.reaction?.emoji ?? ""
        case .actorName: return event.groupAction?.actorName ?? ""
        }
    }
}
