import Foundation

/// One sample line of a Prometheus text exposition.
package struct MetricSample: Sendable, Equatable {
    package var name: String
    package var labels: [String: String]
    package var value: Double

    package init(name: String, labels: [String: String], value: Double) {
        self.name = name
        self.labels = labels
        self.value = value
    }
}

/// The samples of a Prometheus text exposition (a stage's or a stand-in's `/metrics`), in the order given.
package struct MetricSamples: Sendable {
    package var samples: [MetricSample] = []

    /// Reads every sample line; comments, blank lines and lines without a number are passed over. Label values
    /// may hold the `\"`, `\\` and `\n` escapes; a timestamp after the value is ignored.
    package init(_ text: String) {
        for raw in text.split(separator: "\n") {
            let line = raw.trimmingCharacters(in: .whitespaces)
            guard !line.isEmpty, !line.hasPrefix("#") else { continue }
            var name = ""
            var labels: [String: String] = [:]
            var index = line.startIndex
            while index < line.endIndex, line[index] != "{", line[index] != " " {
                name.append(line[index])
                index = line.index(after: index)
            }
            if index < line.endIndex, line[index] == "{" {
                // key="value" pairs; values may hold \" \\ \n escapes.
                index = line.index(after: index)
                while index < line.endIndex, line[index] != "}" {
                    var key = ""
                    while index < line.endIndex, line[index] != "=" {
                        if line[index] != "," && line[index] != " " { key.append(line[index]) }
                        index = line.index(after: index)
                    }
                    index = line.index(index, offsetBy: 2, limitedBy: line.endIndex) ?? line.endIndex  // ="
                    var value = ""
                    while index < line.endIndex, line[index] != "\"" {
                        if line[index] == "\\", line.index(after: index) < line.endIndex {
                            index = line.index(after: index)
                            value.append(line[index] == "n" ? "\n" : line[index])
                        } else {
                            value.append(line[index])
                        }
                        index = line.index(after: index)
                    }
                    if index < line.endIndex { index = line.index(after: index) }  // closing quote
                    while index < line.endIndex, line[index] == "," || line[index] == " " {
                        index = line.index(after: index)
                    }
                    if !key.isEmpty { labels[key] = value }
                }
                if index < line.endIndex { index = line.index(after: index) }
            }
            let fields = line[index...].split(separator: " ")
            guard let first = fields.first, let value = Double(first) else { continue }
            samples.append(MetricSample(name: name, labels: labels, value: value))
        }
    }

    /// The sum of every series of `name`; nil when there is none.
    package func sum(_ name: String) -> Double? {
        let matching = samples.filter { $0.name == name }
        return matching.isEmpty ? nil : matching.reduce(0) { $0 + $1.value }
    }
}
