import ArgumentParser
import Foundation
import HeraldRedis

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
                --batch per round trip. Progress goes to stderr (counted in old keys, found by a first SCAN); the \
                result is one JSON line on stdout.
                """)

        @Option(name: .long, help: "App (tenant) id whose users to migrate.") var app: String
        @Option(name: .long, help: "Users per round trip.") var batch: Int = 500
        @OptionGroup var redis: RedisOptions

        func run() async throws {
            guard batch > 0 else { CLI.fail("--batch: expected a positive number", status: 2) }
            let store = await redis.store()
            let result: LegacyMigration
            do {
                let total = try await store.countLegacyUserKeys(app: app)
                let progress = CLIProgress("state migrate", total: total)
                var shown = 0
                result = try await store.migrateLegacyUserKeys(app: app, batch: batch, now: CLI.nowMillis()) {
                    progress.advance(by: $0.keysDeleted + $0.keysSkipped - shown)
                    shown = $0.keysDeleted + $0.keysSkipped
                }
                progress.finish()
            } catch {
                CLI.fail("redis: \(error)")
            }
            CLI.out(
                CLI.json([
                    "app": app, "users": result.users, "keys_deleted": result.keysDeleted,
                    "keys_skipped": result.keysSkipped,
                ]))
        }
    }
}
