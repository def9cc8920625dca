// The multi-device modes as a suppression table. Sendbird's "send as long as one device is
// offline" sends to every device, so an app in the foreground can show it; `offline_only` keeps Herald's
// earlier rule (only the offline devices); `all_offline` is the default.

import Foundation
import HeraldCore
import Testing

struct MultiDeviceRow: Sendable, CustomStringConvertible {
    var mode: MultiDeviceMode
    var online: [String]
    /// Expected target tokens, or nil for `suppress(online)`.
    var targets: [String]?
    var description: String { "\(mode.rawValue) online=\(online.map { String($0.prefix(2)) })" }
}

let multiDeviceRows: [MultiDeviceRow] = [
    MultiDeviceRow(mode: .allOffline, online: [], targets: [tokenA, tokenB]),
    MultiDeviceRow(mode: .allOffline, online: [tokenB], targets: nil),
    MultiDeviceRow(mode: .anyOffline, online: [], targets: [tokenA, tokenB]),
    MultiDeviceRow(mode: .anyOffline, online: [tokenB], targets: [tokenA, tokenB]),
    MultiDeviceRow(mode: .anyOffline, online: [tokenA, tokenB], targets: nil),
    MultiDeviceRow(mode: .offlineOnly, online: [], targets: [tokenA, tokenB]),
    MultiDeviceRow(mode: .offlineOnly, online: [tokenB], targets: [tokenA]),
    MultiDeviceRow(mode: .offlineOnly, online: [tokenA, tokenB], targets: nil),
    // An online token that cannot take this push (a VoIP token for chat) does not count as an offline device.
    MultiDeviceRow(mode: .anyOffline, online: [tokenA, tokenB, tokenV], targets: nil),
]

@Suite("Multi-device modes (suppression table)")
struct MultiDeviceTableTests {
    @Test("targets per mode and presence", arguments: multiDeviceRows)
    func row(_ row: MultiDeviceRow) throws {
        let e = try event(messageJSON(sender: "u1"))
        let state = user(devices: [device(tokenA), device(tokenB), device(tokenV, kind: .voip)], online: row.online)
        let app = AppConfig(multiDevice: row.mode, credentials: sendbirdApp.credentials)
        let decision = Suppression.decide(event: e, recipient: "u2", state: state, app: app, now: now0)
        if let targets = row.targets {
            #expect(decision.targets.map(\.token) == targets)
        } else {
            #expect(decision == .suppress(.online))
        }
    }

    @Test("the pipeline file names the modes all_offline, any_offline and offline_only")
    func names() {
        #expect(MultiDeviceMode.allCases.map(\.rawValue) == ["all_offline", "any_offline", "offline_only"])
    }
}
