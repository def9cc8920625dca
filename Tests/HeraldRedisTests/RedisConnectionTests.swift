import Foundation
import HeraldRedis
import HeraldTestSupport
import Testing

@Suite("RedisConnection against a real redis-server")
struct RedisConnectionTests {
    @Test("every reply type decodes into its RedisValue case")
    func replyTypes() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }

        #expect(try await redis.send("PING") == .status("PONG"))
        #expect(try await redis.send("SET", "k", "v") == .status("OK"))
        #expect(try await redis.send("GET", "k") == .string(Data("v".utf8)))
        #expect(try await redis.send("GET", "missing") == .null)
        #expect(try await redis.send("INCRBY", "n", 41) == .integer(41))
        #expect(try await redis.send("RPUSH", "l", "a", "b") == .integer(2))
        #expect(
            try await redis.send("LRANGE", "l", 0, -1) == .array([.string(Data("a".utf8)), .string(Data("b".utf8))]))
        let nested = try await redis.send("EVAL", "return {1, 'x', {2, 'y'}}", 0)
        #expect(
            nested == .array([.integer(1), .string(Data("x".utf8)), .array([.integer(2), .string(Data("y".utf8))])]))
        let wrongType = try await redis.send("HGET", "k", "f")
        guard case .error(let message) = wrongType else {
            Issue.record("expected an error reply, got \(wrongType)")
            return
        }
        #expect(message.hasPrefix("WRONGTYPE"))
        #expect(throws: RedisError.self) { try wrongType.orThrow() }
        let unknown = try await redis.send("NOSUCHCOMMAND")
        #expect(unknown.text == nil)
        if case .error = unknown {} else { Issue.record("unknown command should be an error reply: \(unknown)") }
    }

    @Test("keys and values are binary-safe: NUL, CR LF and every byte value survive")
    func binarySafe() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }

        let value = Data((0...255).map { UInt8($0) } + Array("\r\n$3\r\n*1\r\n".utf8) + [0, 0])
        let key = Data([0x6b, 0x00, 0x0d, 0x0a, 0xff])
        #expect(try await redis.send(RedisCommand("SET", key, value)) == .status("OK"))
        #expect(try await redis.send(RedisCommand("GET", key)) == .string(value))
        #expect(try await redis.send(RedisCommand("STRLEN", key)) == .integer(Int64(value.count)))
        let empty = Data()
        let replies = try await redis.pipeline([RedisCommand("SET", "e", empty), RedisCommand("GET", "e")])
        #expect(replies == [.status("OK"), .string(empty)])
    }

    /// Each reply is built in one buffer that the next reply reuses, and a reply larger than one socket read is
    /// built over several reads: values of 300 KB between small and nested replies, many of them in one batch,
    /// come back whole and in order, with nil elements and empty arrays where the server sent them.
    @Test("replies split over many socket reads, and the buffer they share, keep every reply whole and in order")
    func repliesSplitOverReads() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }

        let large = Data((0..<300_000).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) })
        #expect(try await redis.send(RedisCommand("SET", "large", large)) == .status("OK"))
        #expect(try await redis.send(RedisCommand("HSET", "h", "a", "1", "b", large)) == .integer(2))
        var commands: [RedisCommand] = []
        var expected: [RedisValue] = []
        for round in 0..<40 {
            commands.append(RedisCommand("GET", "large"))
            expected.append(.string(large))
            commands.append(RedisCommand("HMGET", "h", "a", "missing", "b"))
            expected.append(.array([.string(Data("1".utf8)), .null, .string(large)]))
            commands.append(RedisCommand("LRANGE", "nothing", 0, -1))
            expected.append(.array([]))
            commands.append(RedisCommand("EVAL", "return {ARGV[1], {tonumber(ARGV[1]), {}}, false}", 0, round))
            expected.append(
                .array([.string(Data(String(round).utf8)), .array([.integer(Int64(round)), .array([])]), .null]))
            commands.append(RedisCommand("HGET", "large", "f"))
            expected.append(.error("WRONGTYPE Operation against a key holding the wrong kind of value"))
        }
        let replies = try await redis.pipeline(commands)
        #expect(replies.count == expected.count)
        for (index, (reply, want)) in zip(replies, expected).enumerated() where reply != want {
            Issue.record("reply \(index) (\(commands[index].name)) differs")
        }
        // A call after the batch reads into the same buffer again.
        #expect(try await redis.send("GET", "large") == .string(large))

        // The same batch, its replies kept flat: the same values, and each element read in place.
        let flat = try await redis.pipelineFlat(RedisBatch(commands: commands))
        #expect(flat.count == expected.count)
        #expect(flat.values == expected)
        let hmget = flat[1]
        #expect(flat.elementCount(hmget) == 3)
        #expect(flat.int(flat.element(hmget, 0)) == 1)
        #expect(flat.isNull(flat.element(hmget, 1)))
        #expect(flat.withBytes(flat.element(hmget, 2)) { Data($0) } == large)
        #expect(flat.withBytes(flat.element(hmget, 1)) { _ in true } == nil)
        let nested = flat[3 + 5]  // round 1's EVAL: {"1", {1, {}}, nil}
        #expect(flat.elementCount(nested) == 3)
        #expect(flat.elementCount(flat.element(nested, 1)) == 2)
        #expect(flat.elementCount(flat.element(flat.element(nested, 1), 1)) == 0)
        #expect(flat.isNull(flat.element(nested, 2)), "the element after a nested array")
        #expect(flat.sibling(after: flat.element(nested, 1)) == flat.element(nested, 2))
        #expect(flat.int(flat.element(nested, 0)) == 1)
        #expect(flat.errorMessage(flat[4])?.hasPrefix("WRONGTYPE") == true)
        #expect(throws: RedisError.self) { try flat.orThrow(flat[4], "HGET") }
        #expect(flat.errorMessage(flat[0]) == nil)
        #expect(flat.elementCount(flat[0]) == nil)

        // Integers read from bulk strings as `RedisValue.int` reads them.
        #expect(
            try await redis.send("HSET", "n", "a", "-12", "b", "12a", "c", "99999999999999999999", "d", "")
                == .integer(4))
        let numbers = try await redis.pipelineFlat(
            RedisBatch(commands: [RedisCommand("HMGET", "n", "a", "b", "c", "d")]))
        let fields = (0..<4).map { numbers.element(numbers[0], $0) }
        #expect(fields.map { numbers.int($0) } == [-12, nil, nil, nil])
        #expect(fields.map { numbers.value($0).int } == [-12, nil, nil, nil])
    }

    /// Proves the batch is one round trip without timing: the batch starts with a BLPOP that blocks the
    /// connection on the server. While it is blocked, the server keeps reading the client's socket into that
    /// client's query buffer without running anything. A client that waits for each reply before writing the next
    /// command would have sent nothing more; a pipelining client has already written the other 1000 commands,
    /// so the blocked client's `qbuf` (CLIENT LIST, read from a second connection) grows to exactly their size.
    /// Only then does the test release the BLPOP.
    @Test("a batch of 1000 commands is written before the first reply is read (one round trip)")
    func pipelineIsOneRoundTrip() async throws {
        let server = try await RedisServer.start()
        let (redis, observer) = try await barrierConnections(server, name: "batcher")
        defer { redis.close(); observer.close() }
        let statsBefore = try await commandCount(observer, "set")

        let writes = (0..<1000).map { RedisCommand("SET", "key:\($0)", "value-\($0)") }
        let batch = [RedisCommand("BLPOP", "barrier", 0)] + writes
        let expectedQueued = writes.reduce(0) { $0 + $1.encodedLength }

        async let replies = redis.pipeline(batch)

        var queued = -1
        for _ in 0..<500 {
            queued = try await queryBufferLength(observer, clientName: "batcher") ?? -1
            if queued == expectedQueued { break }
            try await Task.sleep(for: .milliseconds(10))
        }
        #expect(queued == expectedQueued, "the blocked client's query buffer should hold the whole rest of the batch")
        // Nothing of the batch ran while the barrier held.
        #expect(try await commandCount(observer, "set") == statsBefore)

        _ = try await observer.send("RPUSH", "barrier", "go")
        let answers = try await replies
        #expect(answers.count == 1001)
        #expect(answers[0] == .array([.string(Data("barrier".utf8)), .string(Data("go".utf8))]))
        #expect(answers.dropFirst().allSatisfy { $0 == .status("OK") })
        #expect(try await commandCount(observer, "set") == statsBefore + 1000)
        #expect(try await observer.send("GET", "key:999") == .string(Data("value-999".utf8)))
    }

    @Test("a broken connection fails the batch with a retryable error; the next call reconnects")
    func reconnectAfterRestart() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }

        #expect(try await redis.send("SET", "a", "1") == .status("OK"))
        #expect(redis.isConnected)
        server.kill()
        try await server.restart()

        do {
            _ = try await redis.pipeline([RedisCommand("SET", "b", "2"), RedisCommand("GET", "b")])
            Issue.record("the batch on the dead connection should have failed")
        } catch let error as RedisError {
            #expect(error.isRetryable, "\(error)")
            #expect(error.code == .connectionBroken, "\(error)")
        }
        #expect(!redis.isConnected)

        let retried = try await redis.pipeline([RedisCommand("SET", "b", "2"), RedisCommand("GET", "b")])
        #expect(retried == [.status("OK"), .string(Data("2".utf8))])
        #expect(redis.isConnected)
        // The restarted server started empty: proof that the retry went to the new process.
        #expect(try await redis.send("GET", "a") == .null)
    }

    @Test("while the server is down calls fail fast with a retryable connect error, and recover when it is back")
    func reconnectWithBackoff() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        _ = try await redis.send("PING")
        server.kill()

        var codes: [RedisError.Code] = []
        for _ in 0..<3 {
            do {
                _ = try await redis.send("PING")
            } catch let error as RedisError {
                #expect(error.isRetryable)
                codes.append(error.code)
            }
        }
        #expect(codes.count == 3)
        #expect(codes.first == .connectionBroken)
        #expect(codes.dropFirst().allSatisfy { $0 == .connectFailed })

        try await server.restart()
        #expect(try await redis.send("PING") == .status("PONG"))
    }

    @Test("a command slower than the command timeout fails with a retryable timeout")
    func commandTimeout() async throws {
        let server = try await RedisServer.start()
        var configuration = server.configuration
        configuration.commandTimeout = .milliseconds(200)
        let redis = RedisConnection(configuration: configuration)
        defer { redis.close() }
        do {
            _ = try await redis.send("BLPOP", "never-pushed", 0)
            Issue.record("a BLPOP that never returns should have timed out")
        } catch let error as RedisError {
            #expect(error.code == .timeout, "\(error)")
            #expect(error.isRetryable)
        }
        // The connection was dropped (its state was unknown); the next call gets a fresh one.
        #expect(try await redis.send("PING") == .status("PONG"))
    }

    @Test("many concurrent callers share one connection and each gets its own answers")
    func concurrentCallers() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        try await withThrowingTaskGroup(of: Void.self) { group in
            for caller in 0..<50 {
                group.addTask {
                    let replies = try await redis.pipeline([
                        RedisCommand("SET", "c:\(caller)", "v\(caller)"), RedisCommand("INCR", "counter"),
                        RedisCommand("GET", "c:\(caller)"),
                    ])
                    #expect(replies[0] == .status("OK"))
                    #expect(replies[2] == .string(Data("v\(caller)".utf8)))
                }
            }
            try await group.waitForAll()
        }
        #expect(try await redis.send("GET", "counter").int == 50)
    }

    /// The same barrier as above, across callers: while one caller's BLPOP holds the connection on the server,
    /// twenty other callers each send a command of their own. A connection that serves one call at a time would
    /// keep them until the BLPOP is answered, so the blocked client's query buffer would stay empty; a connection
    /// pipelined across callers has already written all twenty, and the buffer holds exactly their bytes.
    @Test("calls made while another caller waits for its reply are written at once, not after that reply")
    func callsArePipelinedAcrossCallers() async throws {
        let server = try await RedisServer.start()
        let (redis, observer) = try await barrierConnections(server, name: "shared")
        defer { redis.close(); observer.close() }

        async let barrier = redis.send("BLPOP", "barrier", 0)
        try await waitUntil("the BLPOP blocks on the server") {
            try await clientField(observer, clientName: "shared", "cmd") == "blpop"
        }
        let calls = (0..<20).map { RedisCommand("SET", "key:\($0)", "value-\($0)") }
        let expectedQueued = calls.reduce(0) { $0 + $1.encodedLength }
        let replies = Task {
            try await withThrowingTaskGroup(of: (Int, RedisValue).self) { group in
                for (index, call) in calls.enumerated() {
                    group.addTask { (index, try await redis.send(call)) }
                }
                var out: [Int: RedisValue] = [:]
                for try await (index, reply) in group { out[index] = reply }
                return out
            }
        }
        try await waitUntil("the other callers' commands reach the server while the BLPOP is unanswered") {
            try await queryBufferLength(observer, clientName: "shared") == expectedQueued
        }
        #expect(try await commandCount(observer, "set") == 0, "nothing ran while the barrier held")

        _ = try await observer.send("RPUSH", "barrier", "go")
        #expect(try await barrier == .array([.string(Data("barrier".utf8)), .string(Data("go".utf8))]))
        let answers = try await replies.value
        #expect(answers.count == 20)
        #expect(answers.values.allSatisfy { $0 == .status("OK") })
        for index in [0, 7, 19] {
            #expect(try await observer.send("GET", "key:\(index)") == .string(Data("value-\(index)".utf8)))
        }
    }

    @Test("an error reply fails only its own caller's checked write; the calls pipelined around it get their replies")
    func errorReplyStaysWithItsCall() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        _ = try await redis.send("SET", "text", "not a hash")
        try await withThrowingTaskGroup(of: Void.self) { group in
            for caller in 0..<30 {
                group.addTask {
                    if caller % 3 == 0 {
                        var batch = RedisBatch()
                        batch.command("HSET", arguments: 3)
                        batch.argument(caller == 15 ? "text" : "h:\(caller)")
                        batch.argument("f")
                        batch.argument("\(caller)")
                        do {
                            try await redis.write(batch, what: "write \(caller)")
                            #expect(caller != 15, "the HSET on a string key should have failed")
                        } catch let error as RedisError {
                            #expect(caller == 15, "\(error)")
                            #expect(error.code == .serverError)
                            #expect(error.message.hasPrefix("write 15: WRONGTYPE"), "\(error.message)")
                        }
                    } else {
                        let replies = try await redis.pipeline([
                            RedisCommand("SET", "c:\(caller)", "v\(caller)"), RedisCommand("GET", "c:\(caller)"),
                        ])
                        #expect(replies == [.status("OK"), .string(Data("v\(caller)".utf8))])
                    }
                }
            }
            try await group.waitForAll()
        }
        #expect(try await redis.send("HGET", "h:27", "f") == .string(Data("27".utf8)))
    }

    @Test(
        "a connection lost with several callers' commands on the wire fails them all retryably; the next call reconnects"
    )
    func lostConnectionFailsEveryCallOnTheWire() async throws {
        let server = try await RedisServer.start()
        let (redis, observer) = try await barrierConnections(server, name: "doomed")
        defer { redis.close(); observer.close() }

        let calls = [RedisCommand("BLPOP", "barrier", 0)] + (0..<5).map { RedisCommand("INCR", "n:\($0)") }
        let outcomes = Task {
            await withTaskGroup(of: RedisError?.self) { group in
                for call in calls {
                    group.addTask {
                        do {
                            _ = try await redis.send(call)
                            return nil
                        } catch {
                            return error as? RedisError
                        }
                    }
                }
                var errors: [RedisError?] = []
                for await error in group { errors.append(error) }
                return errors
            }
        }
        let incrBytes = calls.dropFirst().reduce(0) { $0 + $1.encodedLength }
        try await waitUntil("every call is on the wire behind the blocked BLPOP") {
            guard try await clientField(observer, clientName: "doomed", "cmd") == "blpop" else { return false }
            return try await queryBufferLength(observer, clientName: "doomed") == incrBytes
        }
        _ = try await observer.send("CLIENT", "KILL", "SKIPME", "yes", "TYPE", "normal")
        let errors = await outcomes.value
        #expect(errors.count == 6)
        for error in errors {
            #expect(error?.isRetryable == true, "\(String(describing: error))")
            #expect(error?.code == .connectionBroken, "\(String(describing: error))")
        }
        #expect(try await redis.send("INCR", "n:0") == .integer(1), "none of the lost INCRs ran; the call reconnected")
    }

    @Test("after close() every call fails with a non-retryable closed error")
    func closeFailsCalls() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        #expect(try await redis.send("PING") == .status("PONG"))
        redis.close()
        do {
            _ = try await redis.send("PING")
            Issue.record("a call after close() should fail")
        } catch let error as RedisError {
            #expect(error.code == .closed)
            #expect(!error.isRetryable)
        }
    }

    @Test("password and database from the URL are applied on connect")
    func authAndSelect() async throws {
        let server = try await RedisServer.start(extraArguments: ["--requirepass", "s3cret"])
        var configuration = try RedisConfiguration(url: "redis://:s3cret@127.0.0.1:\(server.port)/3")
        #expect(configuration.database == 3)
        #expect(configuration.password == "s3cret")
        let redis = RedisConnection(configuration: configuration)
        defer { redis.close() }
        _ = try await redis.send("SET", "x", "y")
        let info = try await redis.send("CLIENT", "INFO").text ?? ""
        #expect(info.contains("db=3"))

        configuration.password = "wrong"
        let refused = RedisConnection(configuration: configuration)
        defer { refused.close() }
        await #expect(throws: RedisError.self) { try await refused.send("PING") }
    }

    @Test("an ACL user from the URL authenticates as that user; the default user is refused")
    func aclUser() async throws {
        let server = try await RedisServer.start(extraArguments: [
            "--user", "default", "off", "--user", "herald", "on", ">p4ss", "~herald:*", "+@all",
        ])
        let configuration = try RedisConfiguration(url: "redis://herald:p4ss@127.0.0.1:\(server.port)")
        #expect(configuration.username == "herald" && configuration.password == "p4ss")
        #expect("\(configuration)".contains("herald:***@") && !"\(configuration)".contains("p4ss"))
        let redis = RedisConnection(configuration: configuration)
        defer { redis.close() }
        #expect(try await redis.send("ACL", "WHOAMI").text == "herald")
        #expect(try await redis.send("SET", "herald:x", "1").text == "OK")
        // The ACL limits this user to herald:* keys.
        if case .error(let message) = try await redis.send("SET", "other", "1") {
            #expect(message.contains("NOPERM"))
        } else {
            Issue.record("a key outside the user's pattern was written")
        }
        // Without a user name the password is tried for the default user, which is off.
        let anonymous = RedisConnection(
            configuration: try RedisConfiguration(url: "redis://:p4ss@127.0.0.1:\(server.port)"))
        defer { anonymous.close() }
        await #expect(throws: RedisError.self) { try await anonymous.send("PING") }
    }

    @Test(
        "URL parsing",
        arguments: [
            ("redis://localhost", "localhost", 6379, nil as String?, 0),
            ("redis://10.0.0.1:7000/2", "10.0.0.1", 7000, nil, 2),
            ("redis://user:p%40ss@h:1", "h", 1, "p@ss", 0),
        ])
    func urlParsing(url: String, host: String, port: Int, password: String?, database: Int) throws {
        let configuration = try RedisConfiguration(url: url)
        #expect(configuration.host == host)
        #expect(configuration.port == port)
        #expect(configuration.password == password)
        #expect(configuration.database == database)
    }

    @Test("bad URLs are rejected with a reason", arguments: ["http://x", "redis://", "redis://h/abc"])
    func badURL(url: String) {
        #expect(throws: RedisError.self) { try RedisConfiguration(url: url) }
        #expect(RedisConfiguration.redacted("redis://:pw@h:1").contains("pw") == false)
    }

    @Test("a Redis URL that does not parse is never echoed with its password")
    func unparseableURLIsRedacted() {
        for url in ["redis://:s3cret@[::1:6379", "redis://app:s3cret@host:63a9", "redis://:s3cret@ho st:1"] {
            #expect(URLComponents(string: url) == nil, "the case is meant not to parse: \(url)")
            #expect(RedisConfiguration.redacted(url).contains("s3cr") == false, "\(RedisConfiguration.redacted(url))")
            do {
                _ = try RedisConfiguration(url: url)
                Issue.record("\(url) was accepted")
            } catch {
                #expect("\(error)".contains("s3cr") == false, "\(error)")
            }
        }
        #expect(RedisConfiguration(host: "h", password: "pw").description == "redis://:***@h:6379/0")
    }

    // MARK: Helpers

    private func commandCount(_ redis: RedisConnection, _ command: String) async throws -> Int {
        let info = try await redis.send("INFO", "commandstats").text ?? ""
        for line in info.split(whereSeparator: \.isNewline) where line.hasPrefix("cmdstat_\(command):calls=") {
            let rest = line.dropFirst("cmdstat_\(command):calls=".count)
            return Int(rest.prefix { $0.isNumber }) ?? 0
        }
        return 0
    }

    /// For the barrier tests: a connection named `name` whose reads wait long (it is held on the server until the
    /// observer has seen what it wrote, which on a loaded machine took over the default 5 s read bound once: the call
    /// then failed with a timeout, not a wrong order), and a second connection to observe it with.
    private func barrierConnections(
        _ server: RedisServer, name: String
    ) async throws -> (RedisConnection, RedisConnection) {
        var patient = server.configuration
        patient.commandTimeout = .seconds(120)
        let redis = RedisConnection(configuration: patient)
        let observer = RedisConnection(configuration: server.configuration)
        _ = try await redis.send("CLIENT", "SETNAME", name)
        return (redis, observer)
    }

    /// A field of the named client's CLIENT LIST line.
    private func clientField(_ redis: RedisConnection, clientName: String, _ field: String) async throws -> String? {
        let list = try await redis.send("CLIENT", "LIST").text ?? ""
        for line in list.split(whereSeparator: \.isNewline) where line.contains(" name=\(clientName) ") {
            for part in line.split(separator: " ") where part.hasPrefix("\(field)=") {
                return String(part.dropFirst(field.count + 1))
            }
        }
        return nil
    }

    private func queryBufferLength(_ redis: RedisConnection, clientName: String) async throws -> Int? {
        let list = try await redis.send("CLIENT", "LIST").text ?? ""
        for line in list.split(whereSeparator: \.isNewline) where line.contains(" name=\(clientName) ") {
            for field in line.split(separator: " ") where field.hasPrefix("qbuf=") {
                return Int(field.dropFirst("qbuf=".count))
            }
        }
        return nil
    }
}
