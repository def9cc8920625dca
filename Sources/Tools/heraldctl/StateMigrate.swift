import ArgumentParser
import Foundation
import HeraldRedis
import HeraldToolSupport

/// `heraldctl state migrate --app A`: move user state written by Herald 0.9 into the one-hash-per-user layout.
extension StateCommand {
    struct Migrate: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Move user state written by Herald 0.9 (four keys per user) into one hash per user.",
            discussion: """
                Herald 0.9 kept each user's devices, presence, preferences and unread counts in four keys \
                (herald:<app>:user:{<user>}:devices, :presence, :prefs, :unread); this version keeps them in one \
                hash, herald:<app>:user:{<user>}:state, and no longer reads the old keys. This command moves every \
                user of --app into the new layout and deletes the old keys. Run it once per app after stopping the \
                old version's herald-registry and herald-resolve and before starting the new ones. It is \
                idempotent: a field the new hash already holds is kept, each user moves in one atomic script, so an \
                interrupted run can be run again, and a second run moves nothing. Presence entries already expired \
                are dropped. The old keys are found with SCAN (on every master of a Redis Cluster); users are moved \
                --batch per round trip. Then it renames the keys of users whose id cannot be a Redis Cluster hash \
                tag as it is (an empty id, or one starting with }): their keys are now named with the id in \
                hexadecimal, herald:<app>:user:hex{0x<hex>}:state and :mentions, so all of them share one slot; a \
                field the new key already holds is kept. Progress goes to stderr (counted in old keys, found by a \
                first SCAN); the result is one JSON line on stdout.
                """)

        @Option(name: .long, help: "App (tenant) id whose users to migrate.") var app: String
        @Option(name: .long, help: "Users per round trip.") var batch: Int = 500
        @OptionGroup var redis: RedisOptions

        func run() async throws {
            guard batch > 0 else { CLI.fail("--batch: expected a positive number", status: 2) }
            let store = await redis.store()
            let result: LegacyMigration
            let renamed: UntaggableMigration
            do {
                let total = try await store.countLegacyUserKeys(app: app)
                let progress = CLIProgress("state migrate", total: total)
                var shown = 0
                result = try await store.migrateLegacyUserKeys(app: app, batch: batch, now: CLI.nowMillis()) {
                    progress.advance(by: $0.keysDeleted + $0.keysSkipped - shown)
                    shown = $0.keysDeleted + $0.keysSkipped
                }
                progress.finish()
                renamed = try await store.migrateUntaggableUserKeys(app: app)
            } catch {
                CLI.fail("redis: \(error)")
            }
            CLI.out(
                CLI.json([
                    "app": .string(app), "users": .int(result.users), "keys_deleted": .int(result.keysDeleted),
                    "keys_skipped": .int(result.keysSkipped), "untaggable_keys_moved": .int(renamed.keysMoved),
                    "untaggable_keys_skipped": .int(renamed.keysSkipped),
                ]))
        }
    }
}
