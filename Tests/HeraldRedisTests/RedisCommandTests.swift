import Foundation
import HeraldRedis
import Testing

@Suite("Redis commands in their wire form")
struct RedisCommandTests {
    @Test("every kind of argument becomes one RESP bulk string")
    func respEncoding() {
        let command = RedisCommand(
            "HSET", "k:é", [0xFF, 0x00] as [UInt8], 0, 42, Int64(-7), Int64.min, "a:b".dropFirst(2),
            Data([0x31]), "")
        let expected =
            "*10\r\n$4\r\nHSET\r\n$4\r\nk:é\r\n$2\r\n\u{FF}\u{00}\r\n$1\r\n0\r\n$2\r\n42\r\n$2\r\n-7\r\n"
            + "$20\r\n-9223372036854775808\r\n$1\r\nb\r\n$1\r\n1\r\n$0\r\n\r\n"
        var bytes: [UInt8] = []
        for scalar in expected.unicodeScalars {
            // The expected text spells raw bytes as scalars below 256, except the UTF-8 of "é".
            if scalar == "é" { bytes += Array("é".utf8) } else { bytes.append(UInt8(scalar.value)) }
        }
        #expect(command.encoded == bytes)
        #expect(command.encodedLength == bytes.count)
        #expect(command.name == "HSET")
    }
}
