/// A value kept behind one reference and copied on write, as an array is; equatable and hashable when its value is.
///
/// A stage copies its records many times over (into a cache, its decisions, its results, the jobs of its
/// clients), and a copy of a struct retains and later releases every string and array in it. The records
/// copied most keep their fields in one of these, so a copy is one retain. Inlinable, so other modules use it
/// compiled for their own value type.
@frozen
public struct CopyOnWrite<Value: Sendable>: Sendable {
    @usableFromInline
    final class Box: @unchecked Sendable {
        // Changed only while one `CopyOnWrite` holds the box (`value`'s `_modify`, `modify`), so no two accesses
        // can overlap, and the run-time exclusivity check every access of a class's property pays is left out.
        @exclusivity(unchecked) @usableFromInline var value: Value
        @inlinable init(_ value: Value) { self.value = value }
    }

    @usableFromInline var box: Box

    @inlinable
    public init(_ value: Value) { box = Box(value) }

    @inlinable
    public var value: Value {
        get { box.value }
        _modify {
            if !isKnownUniquelyReferenced(&box) { box = Box(box.value) }
            yield &box.value
        }
    }

    /// Runs `body` on the value, copied first if another `CopyOnWrite` shares it. A plain function, not an
    /// accessor: a `_modify` accessor is a coroutine, and one that is not inlined allocates its frame on the heap
    /// at every call, so the fields' setters go through this.
    @inlinable @inline(__always)
    public mutating func modify<Result>(_ body: (inout Value) -> Result) -> Result {
        if !isKnownUniquelyReferenced(&box) { box = Box(box.value) }
        return body(&box.value)
    }
}

extension CopyOnWrite: Equatable where Value: Equatable {
    @inlinable
    public static func == (a: Self, b: Self) -> Bool { a.box === b.box || a.box.value == b.box.value }
}

extension CopyOnWrite: Hashable where Value: Hashable {
    @inlinable
    public func hash(into hasher: inout Hasher) { box.value.hash(into: &hasher) }
}
