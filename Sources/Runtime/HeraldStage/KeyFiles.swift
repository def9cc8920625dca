import Foundation
import HeraldCore
import Logging

/// Checks on files that hold secrets (APNs .p8 keys, certificates' private keys, .p12 bundles, service accounts).
public enum KeyFiles {
    /// A warning when `path` can be read (or written) by its group or by others, nil when only its owner can.
    /// A file that cannot be inspected gives no warning here (loading it reports the error).
    public static func exposureWarning(path: String) -> String? {
        guard let attributes = try? FileManager.default.attributesOfItem(atPath: path),
            let permissions = (attributes[.posixPermissions] as? NSNumber)?.intValue
        else { return nil }
        guard permissions & 0o077 != 0 else { return nil }
        return "key file \(path) is accessible to its group or others (mode \(String(permissions, radix: 8))); "
            + "restrict it to its owner (chmod 600)"
    }

    /// The secret files named by `credential`.
    public static func paths(of credential: APNsCredential) -> [String] {
        [credential.keyFile, credential.privateKeyFile, credential.p12File, credential.certificateFile].compactMap {
            $0
        }
    }

    /// Logs a warning for every secret file of `apps` that its group or others can read.
    public static func warnAboutExposedKeys(_ apps: AppDirectory, logger: Logger) {
        var seen = Set<String>()
        for app in Array(apps.apps.values) + [apps.fallback] {
            for credential in app.credentials {
                for path in paths(of: credential) where seen.insert(path).inserted {
                    if let warning = exposureWarning(path: path) {
                        logger.warning("\(warning)", metadata: ["app": "\(app.appID)"])
                    }
                }
            }
        }
    }
}
