/// A pipelined batch cut into the units a Redis Cluster router sends: one command each, except that a
/// `MULTI ... EXEC` (or `... DISCARD`) block is one unit, sent whole to one node.
///
/// The batch is read as it goes over the wire (RESP multi-bulk commands one after another), so `RedisBatch`
/// writers and `RedisCommand` lists are routed the same way, and single-node mode pays nothing.
struct RedisClusterUnit: Sendable {
    /// Where the unit's commands sit in the batch buffer.
    var bytes: Range<Int>
    /// The unit's first command's position in the batch (the index of its first reply).
    var firstCommand: Int
    /// How many commands (and replies) the unit holds.
    var commands: Int
    /// The hash slot of the unit's key (a transaction: of its first keyed command); nil when it names no key and
    /// any node can answer it.
    var slot: Int?
}

enum RedisClusterBatch {
    /// Cuts `bytes` (`count` commands) into units. Throws `unexpectedReply` when the buffer is not RESP commands.
    static func units(of bytes: [UInt8], count: Int) throws -> [RedisClusterUnit] {
        try bytes.withUnsafeBufferPointer { buffer in
            var reader = Reader(buffer: buffer)
            var units: [RedisClusterUnit] = []
            units.reserveCapacity(count)
            var open: RedisClusterUnit?
            var index = 0
            while reader.position < buffer.count {
                let start = reader.position
                let command = try reader.command()
                let kind = classify(command.name.map { UnsafeBufferPointer(rebasing: buffer[$0]) })
                let slot: Int? =
                    switch kind {
                    case .keyed: command.arguments.first.map { RedisSlot.of(UnsafeBufferPointer(rebasing: buffer[$0])) }
                    case .script: scriptSlot(command, buffer)
                    case .keyless, .multi, .endTransaction: nil
                    }
                if var unit = open {
                    unit.bytes = unit.bytes.lowerBound..<reader.position
                    unit.commands += 1
                    if unit.slot == nil { unit.slot = slot }
                    if kind == .endTransaction {
                        units.append(unit)
                        open = nil
                    } else {
                        open = unit
                    }
                } else {
                    let unit = RedisClusterUnit(
                        bytes: start..<reader.position, firstCommand: index, commands: 1, slot: slot)
                    if kind == .multi { open = unit } else { units.append(unit) }
                }
                index += 1
            }
            if let unit = open { units.append(unit) }
            guard index == count else {
                throw RedisError(.unexpectedReply, "the batch holds \(index) commands, not \(count)")
            }
            return units
        }
    }

    enum Kind {
        /// The first argument is the key.
        case keyed
        /// EVAL-like: the argument after the number of keys is the first key.
        case script
        /// Names no key: any node answers it.
        case keyless
        case multi
        /// EXEC or DISCARD.
        case endTransaction
    }

    /// Commands whose first argument is not a key (the ones a Herald component or an operator's tool may send).
    private static let keyless: Set<String> = [
        "PING", "ECHO", "INFO", "CLUSTER", "SCRIPT", "FUNCTION", "FLUSHALL", "FLUSHDB", "DBSIZE", "TIME", "CONFIG",
        "CLIENT", "COMMAND", "AUTH", "SELECT", "HELLO", "READONLY", "READWRITE", "ASKING", "LASTSAVE", "SAVE",
        "BGSAVE", "BGREWRITEAOF", "KEYS", "SCAN", "RANDOMKEY", "WAIT", "PUBLISH", "SLOWLOG", "LATENCY", "DEBUG",
        "ACL", "ROLE", "MEMORY", "MODULE", "SWAPDB", "LOLWUT", "QUIT", "RESET",
    ]

    private static let scripts: Set<String> = [
        "EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL", "FCALL_RO",
    ]

    static func classify(_ name: UnsafeBufferPointer<UInt8>?) -> Kind {
        guard let name, name.count <= 16 else { return .keyed }
        let upper = String(decoding: name, as: UTF8.self).uppercased()
        switch upper {
        case "MULTI": return .multi
        case "EXEC", "DISCARD": return .endTransaction
        default:
            if scripts.contains(upper) { return .script }
            return keyless.contains(upper) ? .keyless : .keyed
        }
    }

    /// `EVAL script numkeys key...`: the slot of the first key, or nil when the script names none.
    private static func scriptSlot(_ command: Reader.Command, _ buffer: UnsafeBufferPointer<UInt8>) -> Int? {
        guard command.arguments.count >= 3 else { return nil }
        let numkeys = Int(String(decoding: UnsafeBufferPointer(rebasing: buffer[command.arguments[1]]), as: UTF8.self))
        guard let numkeys, numkeys > 0 else { return nil }
        return RedisSlot.of(UnsafeBufferPointer(rebasing: buffer[command.arguments[2]]))
    }

    /// Reads commands from a RESP buffer: `*<n>` CRLF, then n times `$<length>` CRLF bytes CRLF.
    struct Reader {
        let buffer: UnsafeBufferPointer<UInt8>
        var position = 0

        struct Command {
            /// The command name's bytes.
            var name: Range<Int>?
            /// The first three arguments after the name (all a router needs).
            var arguments: [Range<Int>]
        }

        mutating func command() throws -> Command {
            try expect(UInt8(ascii: "*"))
            let count = try decimal()
            var command = Command(name: nil, arguments: [])
            for index in 0..<count {
                try expect(UInt8(ascii: "$"))
                let length = try decimal()
                let start = position
                position += length
                guard position + 2 <= buffer.count else { throw malformed() }
                if index == 0 {
                    command.name = start..<position
                } else if index <= 3 {
                    command.arguments.append(start..<position)
                }
                position += 2
            }
            return command
        }

        private mutating func expect(_ byte: UInt8) throws {
            guard position < buffer.count, buffer[position] == byte else { throw malformed() }
            position += 1
        }

        /// A decimal number and its CRLF.
        private mutating func decimal() throws -> Int {
            var value = 0
            var digits = 0
            while position < buffer.count, buffer[position] != 13 {
                let digit = Int(buffer[position]) - 48
                guard (0...9).contains(digit), digits < 18 else { throw malformed() }
                value = value * 10 + digit
                digits += 1
                position += 1
            }
            guard digits > 0, position + 1 < buffer.count, buffer[position + 1] == 10 else { throw malformed() }
            position += 2
            return value
        }

        private func malformed() -> RedisError {
            RedisError(.unexpectedReply, "a batch command is not valid RESP (at byte \(position))")
        }
    }
}
