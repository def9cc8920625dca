// Localised fixed strings and body templates. Built-in catalogs ship English,
// Simplified Chinese, Korean, French, German, Spanish and Japanese; an app may
// override any key per locale (see AppConfig). Templates are parsed once.

/// Language tag handling: lower-case, `_` as `-`, and common aliases
/// (`kr` is Korean, `zh-cn`/`zh-hans`/`zh-sg` are Simplified Chinese).
public enum Language {
    public static func normalize(_ tag: String) -> String {
        // Fast path: already lower-case ASCII letters and dashes, no alias.
        var plain = true
        for b in tag.utf8 where !((b >= 0x61 && b <= 0x7A) || b == 0x2D) { plain = false; break }
        if plain && tag != "kr" && !tag.hasPrefix("zh-") && !tag.hasPrefix("ko-") { return tag }
        var t = tag.lowercased()
        if t.contains("_") { t = t.replacingOccurrences(of: "_", with: "-") }
        switch t {
        case "kr", "ko-kr": return "ko"
        case "zh-cn", "zh-hans", "zh-sg", "zh-hans-cn", "zh-hans-sg": return "zh"
        default: return t
        }
    }

    /// The primary subtag (`fr` of `fr-ca`).
    public static func primary(_ tag: String) -> String {
        let n = normalize(tag)
        if let dash = n.firstIndex(of: "-") { return String(n[..<dash]) }
        return n
    }
}

/// The keys of a string catalog.
public enum CatalogKey: String, CaseIterable, Sendable {
    case defaultText = "template.default.text"
    case defaultFile = "template.default.file"
    case alternativeText = "template.alternative.text"
    case alternativeFile = "template.alternative.file"
    case simpleBanner = "simple_banner"
    case callAudio = "call.audio"
    case callVideo = "call.video"
    case reaction = "reaction"
    case groupJoined = "group_action.joined"
    case groupLeft = "group_action.left"
    case groupAdded = "group_action.added"
    case groupRemoved = "group_action.removed"
    case groupBanned = "group_action.banned"
    case groupUnbanned = "group_action.unbanned"
    case fileImage = "file_type.image"
    case fileVideo = "file_type.video"
    case fileAudio = "file_type.audio"
    case fileOther = "file_type.file"
    /// The alert of a call that rang out or was cancelled (`unanswered`, `cancelled`).
    case callMissed = "call.missed"
    /// The text of a call update that does not ring (`ongoing`, `rejected`, `ended`, `busy`) on FCM and webhooks;
    /// on APNs these are background pushes without text.
    case callOngoing = "call.ongoing"
    case callRejected = "call.rejected"
    case callEnded = "call.ended"
    case callBusy = "call.busy"
    /// The text of a burst update (docs/behaviour.md §6a): `{count}` messages in `{channel_name}`.
    case burst = "burst"
    /// The same for a conversation without a name.
    case burstUnnamed = "burst.unnamed"
    /// The digest when Do Not Disturb or a snooze ends (docs/behaviour.md §6d): `{count}` messages, in
    /// `{channel_name}` (one conversation) or in `{conversation_count}` conversations; `.one` for a single message.
    case digestDND = "digest.dnd"
    case digestDNDOne = "digest.dnd.one"
    case digestDNDIn = "digest.dnd.in"
    case digestDNDOneIn = "digest.dnd.one_in"
    case digestDNDMany = "digest.dnd.many"
    case digestSnooze = "digest.snooze"
    case digestSnoozeOne = "digest.snooze.one"
    case digestSnoozeIn = "digest.snooze.in"
    case digestSnoozeOneIn = "digest.snooze.one_in"
    case digestSnoozeMany = "digest.snooze.many"
    /// After the named conversations of a digest: how many more there were.
    case digestMore = "digest.more"

    /// Position in `allCases`, without building the array.
    var index: Int {
        switch self {
        case .defaultText: return 0
        case .defaultFile: return 1
        case .alternativeText: return 2
        case .alternativeFile: return 3
        case .simpleBanner: return 4
        case .callAudio: return 5
        case .callVideo: return 6
        case .reaction: return 7
        case .groupJoined: return 8
        case .groupLeft: return 9
        case .groupAdded: return 10
        case .groupRemoved: return 11
        case .groupBanned: return 12
        case .groupUnbanned: return 13
        case .fileImage: return 14
        case .fileVideo: return 15
        case .fileAudio: return 16
        case .fileOther: return 17
        case .callMissed: return 18
        case .callOngoing: return 19
        case .callRejected: return 20
        case .callEnded: return 21
        case .callBusy: return 22
        case .burst: return 23
        case .burstUnnamed: return 24
        case .digestDND: return 25
        case .digestDNDOne: return 26
        case .digestDNDIn: return 27
        case .digestDNDOneIn: return 28
        case .digestDNDMany: return 29
        case .digestSnooze: return 30
        case .digestSnoozeOne: return 31
        case .digestSnoozeIn: return 32
        case .digestSnoozeOneIn: return 33
        case .digestSnoozeMany: return 34
        case .digestMore: return 35
        }
    }
}

/// Built-in catalogs. Every locale defines every key.
public enum BuiltInCatalogs {
    public static let english: [CatalogKey: String] = [
        .defaultText: "{sender_name}: {message}",
        .defaultFile: "{filename}",
        .alternativeText: "New message arrived",
        .alternativeFile: "New file arrived",
        .simpleBanner: "You have a new message",
        .callAudio: "AUDIO CALL",
        .callVideo: "VIDEO CALL",
        .reaction: "Reacted to your message: {emoji}",
        .groupJoined: "{actor_name} has joined",
        .groupLeft: "{actor_name} has left",
        .groupAdded: "{actor_name} was added",
        .groupRemoved: "{actor_name} was removed",
        .groupBanned: "{actor_name} was banned",
        .groupUnbanned: "{actor_name} was unbanned",
        .fileImage: "Image", .fileVideo: "Video", .fileAudio: "Audio", .fileOther: "File",
        .callMissed: "Missed call",
        .callOngoing: "Call in progress", .callRejected: "Call declined", .callEnded: "Call ended",
        .burst: "{count} new messages in {channel_name}", .burstUnnamed: "{count} new messages",
        .digestDND: "{count} new messages while Do Not Disturb was on",
        .digestDNDOne: "1 new message while Do Not Disturb was on",
        .digestDNDIn: "{count} new messages in {channel_name} while Do Not Disturb was on",
        .digestDNDOneIn: "1 new message in {channel_name} while Do Not Disturb was on",
        .digestDNDMany: "{count} new messages in {conversation_count} conversations while Do Not Disturb was on",
        .digestSnooze: "{count} new messages while notifications were snoozed",
        .digestSnoozeOne: "1 new message while notifications were snoozed",
        .digestSnoozeIn: "{count} new messages in {channel_name} while notifications were snoozed",
        .digestSnoozeOneIn: "1 new message in {channel_name} while notifications were snoozed",
        .digestSnoozeMany:
            "{count} new messages in {conversation_count} conversations while notifications were snoozed",
        .digestMore: "and {count} more",
        .callBusy: "Line busy",
    ]

    public static let all: [String: [CatalogKey: String]] = [
        "en": english,
        "zh": [
            .defaultText: "{sender_name}: {message}",
            .defaultFile: "{filename}",
            .alternativeText: "收到一条新消息",
            .alternativeFile: "收到一个新文件",
            .simpleBanner: "您有一条新消息",
            .callAudio: "语音通话",
            .callVideo: "视频通话",
            .reaction: "对你的消息发表了回应：{emoji}",
            .groupJoined: "{actor_name} 加入了群组",
            .groupLeft: "{actor_name} 退出了群组",
            .groupAdded: "{actor_name} 被添加到群组",
            .groupRemoved: "{actor_name} 被移出群组",
            .groupBanned: "{actor_name} 被禁言",
            .groupUnbanned: "{actor_name} 被解除禁言",
            .fileImage: "图片", .fileVideo: "视频", .fileAudio: "语音", .fileOther: "文件",
            .callMissed: "未接来电",
            .callOngoing: "通话中", .callRejected: "对方已拒绝通话", .callEnded: "通话已结束", .callBusy: "对方忙线中",
            .burst: "{channel_name}中有{count}条新消息", .burstUnnamed: "{count}条新消息",
            .digestDND: "免打扰期间有{count}条新消息",
            .digestDNDOne: "免打扰期间有1条新消息",
            .digestDNDIn: "免打扰期间{channel_name}中有{count}条新消息",
            .digestDNDOneIn: "免打扰期间{channel_name}中有1条新消息",
            .digestDNDMany: "免打扰期间{conversation_count}个会话中有{count}条新消息",
            .digestSnooze: "通知暂停期间有{count}条新消息",
            .digestSnoozeOne: "通知暂停期间有1条新消息",
            .digestSnoozeIn: "通知暂停期间{channel_name}中有{count}条新消息",
            .digestSnoozeOneIn: "通知暂停期间{channel_name}中有1条新消息",
            .digestSnoozeMany: "通知暂停期间{conversation_count}个会话中有{count}条新消息",
            .digestMore: "另有{count}个",
        ],
        "ko": [
            .defaultText: "{sender_name}: {message}",
            .defaultFile: "{filename}",
            .alternativeText: "새 메시지가 도착했습니다",
            .alternativeFile: "새 파일이 도착했습니다",
            .simpleBanner: "새 메시지가 있습니다",
            .callAudio: "음성 통화",
            .callVideo: "영상 통화",
            .reaction: "회원님의 메시지에 반응했습니다: {emoji}",
            .groupJoined: "{actor_name}님이 참여했습니다",
            .groupLeft: "{actor_name}님이 나갔습니다",
            .groupAdded: "{actor_name}님이 추가되었습니다",
            .groupRemoved: "{actor_name}님이 내보내졌습니다",
            .groupBanned: "{actor_name}님이 차단되었습니다",
            .groupUnbanned: "{actor_name}님의 차단이 해제되었습니다",
            .fileImage: "사진", .fileVideo: "동영상", .fileAudio: "오디오", .fileOther: "파일",
            .callMissed: "부재중 전화",
            .callOngoing: "통화 중", .callRejected: "통화가 거절되었습니다", .callEnded: "통화가 종료되었습니다", .callBusy: "상대방이 통화 중입니다",
            .burst: "{channel_name}에 새 메시지 {count}개", .burstUnnamed: "새 메시지 {count}개",
            .digestDND: "방해 금지 모드 중 새 메시지 {count}개",
            .digestDNDOne: "방해 금지 모드 중 새 메시지 1개",
            .digestDNDIn: "방해 금지 모드 중 {channel_name}에 새 메시지 {count}개",
            .digestDNDOneIn: "방해 금지 모드 중 {channel_name}에 새 메시지 1개",
            .digestDNDMany: "방해 금지 모드 중 대화 {conversation_count}개에 새 메시지 {count}개",
            .digestSnooze: "알림 일시 중지 중 새 메시지 {count}개",
            .digestSnoozeOne: "알림 일시 중지 중 새 메시지 1개",
            .digestSnoozeIn: "알림 일시 중지 중 {channel_name}에 새 메시지 {count}개",
            .digestSnoozeOneIn: "알림 일시 중지 중 {channel_name}에 새 메시지 1개",
            .digestSnoozeMany: "알림 일시 중지 중 대화 {conversation_count}개에 새 메시지 {count}개",
            .digestMore: "외 {count}개",
        ],
        "fr": [
            .defaultText: "{sender_name}: {message}",
            .defaultFile: "{filename}",
            .alternativeText: "Nouveau message reçu",
            .alternativeFile: "Nouveau fichier reçu",
            .simpleBanner: "Vous avez un nouveau message",
            .callAudio: "APPEL AUDIO",
            .callVideo: "APPEL VIDÉO",
            .reaction: "A réagi à votre message : {emoji}",
            .groupJoined: "{actor_name} a rejoint le groupe",
            .groupLeft: "{actor_name} a quitté le groupe",
            .groupAdded: "{actor_name} a été ajouté",
            .groupRemoved: "{actor_name} a été retiré",
            .groupBanned: "{actor_name} a été banni",
            .groupUnbanned: "{actor_name} n'est plus banni",
            .fileImage: "Image", .fileVideo: "Vidéo", .fileAudio: "Audio", .fileOther: "Fichier",
            .callMissed: "Appel manqué",
            .callOngoing: "Appel en cours", .callRejected: "Appel refusé", .callEnded: "Appel terminé",
            .burst: "{count} nouveaux messages dans {channel_name}", .burstUnnamed: "{count} nouveaux messages",
            .digestDND: "{count} nouveaux messages pendant le mode Ne pas déranger",
            .digestDNDOne: "1 nouveau message pendant le mode Ne pas déranger",
            .digestDNDIn: "{count} nouveaux messages dans {channel_name} pendant le mode Ne pas déranger",
            .digestDNDOneIn: "1 nouveau message dans {channel_name} pendant le mode Ne pas déranger",
            .digestDNDMany:
                "{count} nouveaux messages dans {conversation_count} conversations pendant le mode Ne pas déranger",
            .digestSnooze: "{count} nouveaux messages pendant la pause des notifications",
            .digestSnoozeOne: "1 nouveau message pendant la pause des notifications",
            .digestSnoozeIn: "{count} nouveaux messages dans {channel_name} pendant la pause des notifications",
            .digestSnoozeOneIn: "1 nouveau message dans {channel_name} pendant la pause des notifications",
            .digestSnoozeMany:
                "{count} nouveaux messages dans {conversation_count} conversations pendant la pause des notifications",
            .digestMore: "et {count} de plus",
            .callBusy: "Ligne occupée",
        ],
        "de": [
            .defaultText: "{sender_name}: {message}",
            .defaultFile: "{filename}",
            .alternativeText: "Neue Nachricht eingegangen",
            .alternativeFile: "Neue Datei eingegangen",
            .simpleBanner: "Sie haben eine neue Nachricht",
            .callAudio: "SPRACHANRUF",
            .callVideo: "VIDEOANRUF",
            .reaction: "Hat auf deine Nachricht reagiert: {emoji}",
            .groupJoined: "{actor_name} ist beigetreten",
            .groupLeft: "{actor_name} hat die Gruppe verlassen",
            .groupAdded: "{actor_name} wurde hinzugefügt",
            .groupRemoved: "{actor_name} wurde entfernt",
            .groupBanned: "{actor_name} wurde gesperrt",
            .groupUnbanned: "{actor_name} wurde entsperrt",
            .fileImage: "Bild", .fileVideo: "Video", .fileAudio: "Audio", .fileOther: "Datei",
            .callMissed: "Verpasster Anruf",
            .callOngoing: "Anruf läuft", .callRejected: "Anruf abgelehnt", .callEnded: "Anruf beendet",
            .burst: "{count} neue Nachrichten in {channel_name}", .burstUnnamed: "{count} neue Nachrichten",
            .digestDND: "{count} neue Nachrichten, während „Nicht stören“ aktiv war",
            .digestDNDOne: "1 neue Nachricht, während „Nicht stören“ aktiv war",
            .digestDNDIn: "{count} neue Nachrichten in {channel_name}, während „Nicht stören“ aktiv war",
            .digestDNDOneIn: "1 neue Nachricht in {channel_name}, während „Nicht stören“ aktiv war",
            .digestDNDMany:
                "{count} neue Nachrichten in {conversation_count} Unterhaltungen, während „Nicht stören“ aktiv war",
            .digestSnooze: "{count} neue Nachrichten, während Mitteilungen pausiert waren",
            .digestSnoozeOne: "1 neue Nachricht, während Mitteilungen pausiert waren",
            .digestSnoozeIn: "{count} neue Nachrichten in {channel_name}, während Mitteilungen pausiert waren",
            .digestSnoozeOneIn: "1 neue Nachricht in {channel_name}, während Mitteilungen pausiert waren",
            .digestSnoozeMany:
                "{count} neue Nachrichten in {conversation_count} Unterhaltungen, während Mitteilungen pausiert waren",
            .digestMore: "und {count} weitere",
            .callBusy: "Besetzt",
        ],
        "es": [
            .defaultText: "{sender_name}: {message}",
            .defaultFile: "{filename}",
            .alternativeText: "Nuevo mensaje recibido",
            .alternativeFile: "Nuevo archivo recibido",
            .simpleBanner: "Tienes un mensaje nuevo",
            .callAudio: "LLAMADA DE VOZ",
            .callVideo: "VIDEOLLAMADA",
            .reaction: "Reaccionó a tu mensaje: {emoji}",
            .groupJoined: "{actor_name} se ha unido",
            .groupLeft: "{actor_name} ha salido",
            .groupAdded: "{actor_name} fue añadido",
            .groupRemoved: "{actor_name} fue eliminado",
            .groupBanned: "{actor_name} fue bloqueado",
            .groupUnbanned: "{actor_name} fue desbloqueado",
            .fileImage: "Imagen", .fileVideo: "Vídeo", .fileAudio: "Audio", .fileOther: "Archivo",
            .callMissed: "Llamada perdida",
            .callOngoing: "Llamada en curso", .callRejected: "Llamada rechazada", .callEnded: "Llamada finalizada",
            .burst: "{count} mensajes nuevos en {channel_name}", .burstUnnamed: "{count} mensajes nuevos",
            .digestDND: "{count} mensajes nuevos mientras No molestar estaba activado",
            .digestDNDOne: "1 mensaje nuevo mientras No molestar estaba activado",
            .digestDNDIn: "{count} mensajes nuevos en {channel_name} mientras No molestar estaba activado",
            .digestDNDOneIn: "1 mensaje nuevo en {channel_name} mientras No molestar estaba activado",
            .digestDNDMany:
                "{count} mensajes nuevos en {conversation_count} conversaciones mientras No molestar estaba activado",
            .digestSnooze: "{count} mensajes nuevos mientras las notificaciones estaban en pausa",
            .digestSnoozeOne: "1 mensaje nuevo mientras las notificaciones estaban en pausa",
            .digestSnoozeIn: "{count} mensajes nuevos en {channel_name} mientras las notificaciones estaban en pausa",
            .digestSnoozeOneIn: "1 mensaje nuevo en {channel_name} mientras las notificaciones estaban en pausa",
            .digestSnoozeMany:
                "{count} mensajes nuevos en {conversation_count} conversaciones mientras las notificaciones estaban en pausa",
            .digestMore: "y {count} más",
            .callBusy: "Línea ocupada",
        ],
        "ja": [
            .defaultText: "{sender_name}: {message}",
            .defaultFile: "{filename}",
            .alternativeText: "新しいメッセージが届きました",
            .alternativeFile: "新しいファイルが届きました",
            .simpleBanner: "新しいメッセージがあります",
            .callAudio: "音声通話",
            .callVideo: "ビデオ通話",
            .reaction: "あなたのメッセージにリアクションしました: {emoji}",
            .groupJoined: "{actor_name}さんが参加しました",
            .groupLeft: "{actor_name}さんが退出しました",
            .groupAdded: "{actor_name}さんが追加されました",
            .groupRemoved: "{actor_name}さんが削除されました",
            .groupBanned: "{actor_name}さんがブロックされました",
            .groupUnbanned: "{actor_name}さんのブロックが解除されました",
            .fileImage: "画像", .fileVideo: "動画", .fileAudio: "音声", .fileOther: "ファイル",
            .callMissed: "不在着信",
            .callOngoing: "通話中", .callRejected: "通話が拒否されました", .callEnded: "通話が終了しました", .callBusy: "話し中",
            .burst: "{channel_name}に{count}件の新着メッセージ", .burstUnnamed: "{count}件の新着メッセージ",
            .digestDND: "おやすみモード中に{count}件の新着メッセージ",
            .digestDNDOne: "おやすみモード中に1件の新着メッセージ",
            .digestDNDIn: "おやすみモード中に{channel_name}に{count}件の新着メッセージ",
            .digestDNDOneIn: "おやすみモード中に{channel_name}に1件の新着メッセージ",
            .digestDNDMany: "おやすみモード中に{conversation_count}件の会話に{count}件の新着メッセージ",
            .digestSnooze: "通知の一時停止中に{count}件の新着メッセージ",
            .digestSnoozeOne: "通知の一時停止中に1件の新着メッセージ",
            .digestSnoozeIn: "通知の一時停止中に{channel_name}に{count}件の新着メッセージ",
            .digestSnoozeOneIn: "通知の一時停止中に{channel_name}に1件の新着メッセージ",
            .digestSnoozeMany: "通知の一時停止中に{conversation_count}件の会話に{count}件の新着メッセージ",
            .digestMore: "ほか{count}件",
        ],
    ]
}

/// A template variable.
public enum TemplateVariable: String, Sendable, CaseIterable {
    case senderName = "sender_name"
    case message
    case filename
    case channelName = "channel_name"
    case fileTypeFriendly = "file_type_friendly"
    case emoji
    case actorName = "actor_name"
    /// The number of messages of a burst (the `burst` strings) or of a digest (the `digest` strings).
    case count
    /// The number of conversations of a digest (the `digest` strings).
    case conversationCount = "conversation_count"
}

/// A parsed template: literal runs and variables. Unknown `{names}` stay literal.
public struct Template: Sendable, Hashable {
    public enum Part: Sendable, Hashable {
        case literal(String)
        case variable(TemplateVariable)
    }

    public let source: String
    public let parts: [Part]

    public init(_ source: String) {
        self.source = source
        var parts: [Part] = []
        var literal = ""
        var rest = Substring(source)
        while let open = rest.firstIndex(of: "{") {
            literal += rest[..<open]
            let after = rest[rest.index(after: open)...]
            if let close = after.firstIndex(of: "}"), let v = TemplateVariable(rawValue: String(after[..<close])) {
                if !literal.isEmpty { parts.append(.literal(literal)); literal = "" }
                parts.append(.variable(v))
                rest = after[after.index(after: close)...]
            } else {
                literal += "{"
                rest = after
            }
        }
        literal += rest
        if !literal.isEmpty { parts.append(.literal(literal)) }
        self.parts = parts
    }

    /// Whether rendering reads `variable`.
    public func uses(_ variable: TemplateVariable) -> Bool {
        parts.contains { if case .variable(let v) = $0 { return v == variable } else { return false } }
    }

    public func render(_ value: (TemplateVariable) -> String) -> String {
        if parts.count == 1, case .literal(let s) = parts[0] { return s }
        if parts.isEmpty { return "" }
        // The pieces first (on the stack), so the result is allocated once at its size: a guess grew it again for
        // most message texts.
        return withUnsafeTemporaryAllocation(of: String.self, capacity: parts.count) { pieces in
            var total = 0
            for (index, part) in parts.enumerated() {
                let piece: String
                switch part {
                case .literal(let s): piece = s
                case .variable(let v): piece = value(v)
                }
                total += piece.utf8.count
                pieces.initializeElement(at: index, to: piece)
            }
            var out = ""
            out.reserveCapacity(total)
            for index in parts.indices { out += pieces[index] }
            _ = pieces.deinitialize()
            return out
        }
    }
}

/// A text/file template pair.
public struct TemplatePair: Sendable, Hashable {
    public var text: String
    public var file: String
    public init(text: String, file: String) { self.text = text; self.file = file }
}

/// The resolved strings for one (app, locale): every key present, templates parsed.
public struct Strings: Sendable {
    public let locale: String
    let values: [Template]

    init(locale: String, lookup: (CatalogKey) -> String) {
        self.locale = locale
        values = CatalogKey.allCases.map { Template(lookup($0)) }
    }

    public subscript(key: CatalogKey) -> Template {
        values[key.index]
    }
}
