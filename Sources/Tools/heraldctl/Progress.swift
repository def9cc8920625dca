import Foundation

/// Progress of a long operator command on stderr (stdout keeps the command's JSON lines): a bar redrawn in place
/// when stderr is a terminal, otherwise plain lines (`replay: 500/2000 (25%)`), one per tenth and a last one, so a
/// log or a CI job shows how far it got without carriage returns.
final class CLIProgress {
    let label: String
    let total: Int
    private let terminal: Bool
    private let clock = ContinuousClock()
    private var done = 0
    private var lastDraw: ContinuousClock.Instant?
    private var lastTenth = 0
    private var finished = false

    /// - Parameter terminal: whether to draw a bar; by default, whether stderr is a terminal.
    init(_ label: String, total: Int, terminal: Bool = isatty(STDERR_FILENO) == 1) {
        self.label = label
        self.total = max(total, 0)
        self.terminal = terminal
    }

    func advance(by count: Int = 1) {
        done = min(total, done + count)
        if terminal {
            let now = clock.now
            if let lastDraw, now - lastDraw < .milliseconds(100), done < total { return }
            lastDraw = now
            write("\r" + Self.bar(label: label, done: done, total: total))
        } else if total > 0 {
            let tenth = done * 10 / total
            if tenth > lastTenth && done < total {
                lastTenth = tenth
                write(Self.line(label: label, done: done, total: total) + "\n")
            }
        }
    }

    /// The last state: the full bar and a newline, or a last plain line.
    func finish() {
        guard !finished else { return }
        finished = true
        if terminal {
            write("\r" + Self.bar(label: label, done: done, total: total) + "\n")
        } else {
            write(Self.line(label: label, done: done, total: total) + "\n")
        }
    }

    static func percent(_ done: Int, _ total: Int) -> Int { total == 0 ? 100 : done * 100 / total }

    /// `replay [##########··········]  50% 1000/2000`
    static func bar(label: String, done: Int, total: Int, width: Int = 30) -> String {
        let filled = total == 0 ? width : done * width / total
        let bar = String(repeating: "#", count: filled) + String(repeating: "·", count: width - filled)
        let pct = String(percent(done, total))
        return "\(label) [\(bar)] \(String(repeating: " ", count: max(0, 3 - pct.count)))\(pct)% \(done)/\(total)"
    }

    /// `replay: 1000/2000 (50%)`
    static func line(label: String, done: Int, total: Int) -> String {
        "\(label): \(done)/\(total) (\(percent(done, total))%)"
    }

    private func write(_ text: String) {
        CLI.write(text, to: .standardError)
    }
}
