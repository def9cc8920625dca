/// An integer's decimal digits written as ASCII bytes straight into a buffer, without making a String: RESP
/// lengths and arguments, JSON numbers, explain lines, HTTP/2 header values and Prometheus lines all go through here.
/// Inlinable, so the hot paths of other modules get it compiled in place.
public enum DecimalASCII {
    /// The most bytes an `Int64` takes: 19 digits and a minus sign.
    public static let maxLength = 20

    /// How many bytes `value` takes in decimal, its sign included (1 to `maxLength`).
    @inlinable
    public static func length(of value: Int64) -> Int {
        var length = value < 0 ? 2 : 1
        var rest = value.magnitude
        while rest >= 10 {
            rest /= 10
            length += 1
        }
        return length
    }

    /// Writes `value` in decimal so that its last digit is the byte just before `end`, and returns how many bytes
    /// it wrote: they are `end - count ..< end`. The memory before `end` must have room for `length(of: value)`.
    @inlinable
    public static func write(_ value: Int64, endingAt end: UnsafeMutablePointer<UInt8>) -> Int {
        var position = end
        var rest = value.magnitude
        repeat {
            position -= 1
            position.pointee = UInt8(ascii: "0") &+ UInt8(truncatingIfNeeded: rest % 10)
            rest /= 10
        } while rest > 0
        if value < 0 {
            position -= 1
            position.pointee = UInt8(ascii: "-")
        }
        return end - position
    }

    /// Appends `value` in decimal to `out`: the digits are written backwards into a buffer on the stack and then
    /// copied in one append.
    @inlinable
    public static func append(_ value: Int64, to out: inout [UInt8]) {
        var scratch: (UInt64, UInt64, UInt64) = (0, 0, 0)
        withUnsafeMutableBytes(of: &scratch) { raw in
            guard let base = raw.baseAddress?.assumingMemoryBound(to: UInt8.self) else { return }
            let end = base + raw.count
            let count = write(value, endingAt: end)
            out.append(contentsOf: UnsafeBufferPointer(start: end - count, count: count))
        }
    }
}
