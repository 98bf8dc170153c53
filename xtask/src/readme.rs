//! `cargo xtask readme`: the README's first example, built and run as a new user would
//! run it. The dependency lines and `src/main.rs` are copied from the README's "Use it"
//! section as written into a fresh crate outside the workspace; only `[patch.crates-io]`
//! is added, so `durq = "0.1"` resolves to this tree instead of the registry. The run
//! must print a line per job and the closing count, and exit 0.

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::workspace_root;

/// The section of README.md that holds the example.
const SECTION: &str = "## Use it";
/// Names from the example's recipients; each must be printed by the handler.
const RECIPIENTS: &[&str] = &["ada@example.com", "grace@example.com", "edsger@example.com"];

pub(crate) fn run() -> Result<(), String> {
    let root = workspace_root();
    let readme = fs::read_to_string(root.join("README.md"))
        .map_err(|err| format!("read README.md: {err}"))?;
    let example = Example::from_readme(&readme)?;

    // Kept between runs (as cargo's own target directory is), apart from the
    // workspace's: the fresh crate's features differ, so sharing would rebuild both.
    let dir = root.join("target").join("readme-example");
    fs::create_dir_all(dir.join("src"))
        .map_err(|err| format!("create {}: {err}", dir.display()))?;
    write(&dir.join("Cargo.toml"), &example.manifest(&root))?;
    write(&dir.join("src").join("main.rs"), &example.main)?;
    // The workspace's lock file pins the versions CI has already tested (and
    // downloaded); cargo drops the entries the fresh crate does not use.
    fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock"))
        .map_err(|err| format!("copy Cargo.lock: {err}"))?;
    // The example's store is a file in the crate's directory: start from none, so
    // the printed count is this run's.
    let database = dir.join("durq-demo.db");
    for suffix in ["", "-wal", "-shm"] {
        let file = format!("{}{suffix}", database.display());
        let _ = fs::remove_file(file);
    }

    eprintln!(
        "\n==> cargo run (the README's example, in {})",
        dir.display()
    );
    let cargo = crate::cargo_program();
    let output = Command::new(cargo)
        .args(["run", "--quiet"])
        .current_dir(&dir)
        // Not the workspace's: xtask runs under `cargo run`, which sets it.
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .map_err(|err| format!("cannot start cargo run: {err}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    print!("{stdout}");
    if !output.status.success() {
        return Err(format!(
            "the README's example failed ({}):\n{stderr}",
            output.status
        ));
    }
    check_output(&stdout)
}

/// What the README's example must print: one line per job, then the count.
fn check_output(stdout: &str) -> Result<(), String> {
    for to in RECIPIENTS {
        let line = format!("sent to {to} (attempt 1)");
        if !stdout.lines().any(|printed| printed == line) {
            return Err(format!(
                "the README's example did not print {line:?}:\n{stdout}"
            ));
        }
    }
    let count = format!("{} emails sent so far, 0 waiting", RECIPIENTS.len());
    if stdout.lines().last() != Some(count.as_str()) {
        return Err(format!(
            "the README's example did not end with {count:?}:\n{stdout}"
        ));
    }
    Ok(())
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    fs::write(path, text).map_err(|err| format!("write {}: {err}", path.display()))
}

/// The two blocks of the README's example, as written.
#[derive(Debug, PartialEq)]
struct Example {
    /// The TOML block: the `[dependencies]` a user adds.
    dependencies: String,
    /// The Rust block: `src/main.rs`.
    main: String,
}

impl Example {
    /// The first ```` ```toml ```` block of the section and the first ```` ```rust ````
    /// block after it.
    fn from_readme(readme: &str) -> Result<Example, String> {
        let start = readme
            .find(SECTION)
            .ok_or_else(|| format!("README.md has no {SECTION:?} section"))?;
        let section = &readme[start..];
        let (dependencies, rest) = fenced(section, "```toml\n")
            .ok_or_else(|| format!("no ```toml block in {SECTION:?}"))?;
        let (main, _) = fenced(rest, "```rust\n")
            .ok_or_else(|| format!("no ```rust block after the TOML in {SECTION:?}"))?;
        Ok(Example {
            dependencies: dependencies.to_owned(),
            main: main.to_owned(),
        })
    }

    /// The fresh crate's manifest: a package of its own (an empty `[workspace]`, so
    /// cargo does not take it for a member of the tree it sits in), the README's lines,
    /// and the patch that points `durq` at this tree.
    fn manifest(&self, root: &Path) -> String {
        let mut manifest = String::from(
            "[package]\nname = \"readme-example\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n[workspace]\n\n",
        );
        manifest.push_str(&self.dependencies);
        // Only the facade: it takes the rest of the family from this tree by path.
        let path = root.join("crates").join("durq").display().to_string();
        // Debug-quoted: a TOML basic string, with any backslash of the path escaped.
        manifest.push_str(&format!(
            "\n[patch.crates-io]\ndurq = {{ path = {path:?} }}\n"
        ));
        manifest
    }
}

/// The text of the first block opened by `fence` in `text`, and what follows it.
fn fenced<'a>(text: &'a str, fence: &str) -> Option<(&'a str, &'a str)> {
    let open = text.find(fence)? + fence.len();
    let body = &text[open..];
    let close = body.find("```")?;
    Some((&body[..close], &body[close + 3..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_is_the_section_s_toml_then_rust_block() {
        let readme = "# x\n```rust\nnot this\n```\n## Use it\ntext\n```toml\n[dependencies]\ndurq = \"0.1\"\n```\nmore\n```rust\nfn main() {}\n```\n```rust\nnor this\n```\n";
        let example = Example::from_readme(readme).expect("found");
        assert_eq!(example.dependencies, "[dependencies]\ndurq = \"0.1\"\n");
        assert_eq!(example.main, "fn main() {}\n");
        let manifest = example.manifest(Path::new("/w"));
        assert!(manifest.contains("[workspace]\n"), "{manifest}");
        assert!(
            manifest.contains("durq = { path = \"/w/crates/durq\" }"),
            "{manifest}"
        );
        assert!(Example::from_readme("## Use it\n```rust\nfn main() {}\n```\n").is_err());
        assert!(Example::from_readme("no section").is_err());
    }

    #[test]
    fn the_output_needs_every_job_and_the_count_last() {
        let good = "sent to grace@example.com (attempt 1)\nsent to ada@example.com (attempt 1)\nsent to edsger@example.com (attempt 1)\n3 emails sent so far, 0 waiting\n";
        assert_eq!(check_output(good), Ok(()));
        let missing = good.replace("sent to ada@example.com (attempt 1)\n", "");
        assert!(check_output(&missing).is_err());
        // The README's old example: spawned, shut down at once, printed nothing.
        assert!(check_output("").is_err());
        let count_first = "3 emails sent so far, 0 waiting\nsent to grace@example.com (attempt 1)\nsent to ada@example.com (attempt 1)\nsent to edsger@example.com (attempt 1)\n";
        assert!(check_output(count_first).is_err());
    }
}
