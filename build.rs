//! Names the commit a build comes from, so operators can tell builds apart: `hookbox --version`,
//! the first startup line and `hookbox_build_info` say `0.1.0+<commit>`. A build outside a git
//! checkout (a source archive) says the package version alone.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?;
    Some(text.trim().to_owned()).filter(|text| !text.is_empty())
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let commit = git(&["rev-parse", "--short=9", "HEAD"]);
    println!(
        "cargo:rustc-env=HOOKBOX_COMMIT={}",
        commit
            .map(|commit| format!("+{commit}"))
            .unwrap_or_default()
    );
    // Built again when HEAD moves: the file HEAD, the branch's own ref (or, where it is packed
    // or not yet written, the folder a new commit writes it to, and packed-refs).
    let mut watched = Vec::new();
    watched.extend(git(&["rev-parse", "--git-path", "HEAD"]));
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        match git(&["rev-parse", "--git-path", &branch]) {
            Some(path) if Path::new(&path).exists() => watched.push(path),
            _ => {
                watched.extend(git(&["rev-parse", "--git-path", "refs/heads"]));
            }
        }
        watched.extend(git(&["rev-parse", "--git-path", "packed-refs"]));
    }
    for path in watched.iter().filter(|path| Path::new(path).exists()) {
        println!("cargo:rerun-if-changed={path}");
    }
}
