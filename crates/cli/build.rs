//! Stamps the git commit into the binary for `outbox-relay --version` (env
//! `OUTBOX_RELAY_GIT_COMMIT`): `git rev-parse --short=12 HEAD` when the source is a git checkout,
//! else the `OUTBOX_RELAY_GIT_COMMIT` the build was given (a Docker build copies no `.git`),
//! else `unknown`. Rebuilt when HEAD moves.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=OUTBOX_RELAY_GIT_COMMIT");
    let from_env = std::env::var("OUTBOX_RELAY_GIT_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty());
    let from_git = || {
        let out = Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .output()
            .ok()?;
        let commit = String::from_utf8(out.stdout).ok()?.trim().to_owned();
        (out.status.success() && !commit.is_empty()).then_some(commit)
    };
    let commit = from_env
        .or_else(from_git)
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=OUTBOX_RELAY_GIT_COMMIT={commit}");
    // HEAD names the branch; the branch's ref file (or packed-refs) moves with each commit.
    if let Ok(out) = Command::new("git")
        .args(["rev-parse", "--git-dir"])
        .output()
    {
        let dir = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if out.status.success() && !dir.is_empty() {
            let dir = Path::new(&dir);
            println!("cargo:rerun-if-changed={}", dir.join("HEAD").display());
            println!(
                "cargo:rerun-if-changed={}",
                dir.join("packed-refs").display()
            );
            if let Ok(head) = std::fs::read_to_string(dir.join("HEAD")) {
                if let Some(r) = head.strip_prefix("ref: ") {
                    println!("cargo:rerun-if-changed={}", dir.join(r.trim()).display());
                }
            }
        }
    }
}
