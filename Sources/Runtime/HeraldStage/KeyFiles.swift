import Foundation
import HeraldCore
import Logging

#if canImport(Glibc)
import Glibc
#endif

/// Checks on files that hold secrets (APNs .p8 keys, certificates' private keys, .p12 bundles, FCM service
/// accounts, the Redis client key).
public enum KeyFiles {
    /// A warning when `path` can be read (or written) by its group or by others, nil when only its owner can.
    /// Links are followed: the mode that counts is the file's the link leads to (a Kubernetes secret mounted as a
    /// volume is a link to a link to the file; the links themselves always read 777). A file that cannot be
    /// inspected gives no warning here (loading it reports the error).
    ///
    /// One group-readable shape is private enough and gets no warning: a Kubernetes secret volume mounted for a pod
    /// that does not run as root (`runAsUser`, `fsGroup`), where the file belongs to root, its group is the pod's
    /// group (one of this process's groups) and others have no access (`defaultMode: 0440`). The process could not
    /// read a 0400 file there at all.
    public static func exposureWarning(
        path: String, processUID: UInt32 = getuid(), processGroups: Set<UInt32> = currentGroups()
    ) -> String? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        let permissions = Int(info.st_mode) & 0o777
        guard permissions & 0o077 != 0 else { return nil }
        let podSecret =
            processUID != 0 && info.st_uid == 0 && processGroups.contains(info.st_gid) && permissions & 0o037 == 0
        if podSecret { return nil }
        return "key file \(path) is accessible to its group or others (mode \(String(permissions, radix: 8))); "
            + "restrict it to its owner (chmod 600), or on Kubernetes to the pod's group (defaultMode 0440 with fsGroup)"
    }

    /// This process's group and supplementary groups.
    public static func currentGroups() -> Set<UInt32> {
        var groups = [gid_t](repeating: 0, count: 256)
        let count = getgroups(Int32(groups.count), &groups)
        return Set(groups.prefix(Int(max(0, count)))).union([getgid()])
    }

    /// Warns about every file `kafka.properties_file` names that its group or others can read (SASL passwords, TLS
    /// keys given inline).
    public static func warnAboutExposedKafkaSecrets(_ files: [String: String], logger: Logger) {
        for (property, path) in files.sorted(by: { $0.key < $1.key }) {
            if let warning = exposureWarning(path: path) {
                logger.warning("\(warning)", metadata: ["property": "\(property)"])
            }
        }
    }

    /// The secret files named by `credential`.
    public static func paths(of credential: APNsCredential) -> [String] {
        [credential.keyFile, credential.privateKeyFile, credential.p12File, credential.certificateFile].compactMap {
            $0
        }
    }

    /// The secret files of `app`: its APNs credentials', its FCM service accounts (which hold a private key) and its
    /// Web Push VAPID key.
    public static func paths(of app: AppConfig) -> [String] {
        app.credentials.flatMap { paths(of: $0) } + app.fcmCredentials.map(\.serviceAccountFile)
            + (app.webPush.map { [$0.vapidKeyFile] } ?? [])
    }

    /// Logs a warning for every secret file of `apps` that its group or others can read.
    public static func warnAboutExposedKeys(_ apps: AppDirectory, logger: Logger) {
        var seen = Set<String>()
        for app in Array(apps.apps.values) + [apps.fallback] {
            for path in paths(of: app) where seen.insert(path).inserted {
                if let warning = exposureWarning(path: path) {
                    logger.warning("\(warning)", metadata: ["app": "\(app.appID)"])
                }
            }
        }
    }
}
