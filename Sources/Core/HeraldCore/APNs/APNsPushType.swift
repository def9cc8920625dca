/// `apns-push-type`: every value APNs accepts. The one push-type enum: render writes it into the outbound record,
/// the APNs client sends it as the header, and `heraldctl push` takes it on its command line.
/// (The stand-in, HeraldMockAPNs, parses the header with its own code on purpose.)
public enum APNsPushType: String, Sendable, Hashable, CaseIterable {
    case alert, background, voip, location, complication, fileprovider, mdm
    case liveactivity, pushtotalk, widgets, controls

    /// Largest payload APNs accepts for this push type, in bytes.
    public var payloadLimit: Int { self == .voip ? 5120 : 4096 }
}
