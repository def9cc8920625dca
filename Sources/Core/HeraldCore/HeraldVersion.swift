/// Herald's version, written in this one place. `heraldctl --version`, each stage's `stage starting` log line and
/// the `herald_build_info{version}` gauge on every stage's `/metrics` read it. CHANGELOG.md lists what each
/// version holds.
public enum HeraldVersion {
    public static let current = "0.9.0"
}
