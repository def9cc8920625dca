import Foundation
import Yams

/// A YAML mapping with string keys, in document order.
struct YAMLMap {
    var pairs: [(String, Node)]
    var marks: [String: String]
    subscript(key: String) -> Node? {
        for (k, v) in pairs where k == key { return v }
        return nil
    }
}

/// Reads typed values from YAML nodes, collecting unknown-key warnings.
struct Reader {
    var warnings: [String] = []

    func where_(_ node: Node) -> String { node.mark.map { " (line \($0.line))" } ?? "" }

    func mapping(_ node: Node, _ path: String) throws(ConfigError) -> YAMLMap {
        if case .scalar = node, node.null != nil { return YAMLMap(pairs: [], marks: [:]) }
        guard let m = node.mapping else {
            throw ConfigError(path: path.isEmpty ? "(file)" : path, message: "expected a mapping\(where_(node))")
        }
        var pairs: [(String, Node)] = []
        var marks: [String: String] = [:]
        for (k, v) in m {
            guard let key = k.string else {
                throw ConfigError(path: path, message: "keys must be strings\(where_(k))")
            }
            pairs.append((key, v))
            marks[key] = where_(k)
        }
        return YAMLMap(pairs: pairs, marks: marks)
    }

    func sequence(_ node: Node, _ path: String) throws(ConfigError) -> [Node] {
        guard let s = node.sequence else {
            throw ConfigError(path: path, message: "expected a list\(where_(node))")
        }
        return Array(s)
    }

    mutating func check(_ map: YAMLMap, _ path: String, known: Set<String>) {
        for (key, _) in map.pairs where !known.contains(key) {
            let full = path.isEmpty ? key : path + "." + key
            warnings.append(
                "\(full): unknown key\(map.marks[key] ?? "") (known: \(known.sorted().joined(separator: ", ")))")
        }
    }

    func string(_ node: Node?, _ path: String) throws(ConfigError) -> String? {
        guard let node else { return nil }
        if node.null != nil, node.scalar?.style == .plain { return nil }
        guard case .scalar(let s) = node else {
            throw ConfigError(path: path, message: "expected a string\(where_(node))")
        }
        return s.string
    }

    func int(_ node: Node?, _ path: String, in range: ClosedRange<Int> = 0...Int(Int32.max)) throws(ConfigError) -> Int?
    {
        guard let node else { return nil }
        guard let v = node.int else {
            throw ConfigError(path: path, message: "expected an integer\(where_(node))")
        }
        guard range.contains(v) else {
            throw ConfigError(path: path, message: "expected \(range.lowerBound)...\(range.upperBound), got \(v)")
        }
        return v
    }

    func bool(_ node: Node?, _ path: String) throws(ConfigError) -> Bool? {
        guard let node else { return nil }
        guard let v = node.bool else {
            throw ConfigError(path: path, message: "expected true or false\(where_(node))")
        }
        return v
    }
}
