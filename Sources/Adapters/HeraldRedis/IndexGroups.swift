/// Positions grouped by a key, the groups in the order their keys first appear and each group's positions in the
/// order they were added, every group one slice of a single array. A batch's items mostly fall in groups of their
/// own (a shard of a thousand), and an array per group cost an allocation per item.
struct IndexGroups<Key: Hashable> {
    /// The groups' keys, in the order they first appeared.
    private(set) var keys: [Key] = []
    private var numbers: [Key: Int] = [:]
    private var counts: [Int] = []
    /// Each added position and its group's number.
    private var positions: [Int] = []
    private var groupOf: [Int] = []

    init(capacity: Int) {
        positions.reserveCapacity(capacity)
        groupOf.reserveCapacity(capacity)
    }

    /// Adds `position` to `key`'s group, and returns the group's number.
    @discardableResult
    mutating func add(_ position: Int, to key: Key) -> Int {
        let group: Int
        if let known = numbers[key] {
            group = known
        } else {
            group = keys.count
            numbers[key] = group
            keys.append(key)
            counts.append(0)
        }
        add(position, toGroup: group)
        return group
    }

    /// Adds `position` to the group `add(_:to:)` numbered `group`, without hashing its key again.
    mutating func add(_ position: Int, toGroup group: Int) {
        positions.append(position)
        groupOf.append(group)
        counts[group] += 1
    }

    /// Each group's positions (parallel to `keys`).
    func members() -> [ArraySlice<Int>] {
        var next = [Int](repeating: 0, count: keys.count)
        var start = 0
        for group in counts.indices {
            next[group] = start
            start += counts[group]
        }
        var flat = [Int](repeating: 0, count: positions.count)
        for (k, group) in groupOf.enumerated() {
            flat[next[group]] = positions[k]
            next[group] += 1
        }
        // Each group's fill stopped where its positions end.
        return counts.indices.map { flat[(next[$0] - counts[$0])..<next[$0]] }
    }
}
