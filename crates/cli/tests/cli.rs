//! The binary's self-description: `--version` names the commit, `completions <shell>` prints a
//! script the shell accepts, `man` a manual page. No servers needed.

use std::process::Command;

fn relay(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args(args)
        .output()
        .expect("the outbox-relay binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn version_names_the_git_commit_it_was_built_from() {
    let (ok, stdout, _) = relay(&["--version"]);
    assert!(ok);
    let git = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    // A source tree without git (a tarball) is stamped `unknown`.
    let commit = git.unwrap_or_else(|| "unknown".to_owned());
    assert_eq!(
        stdout.trim(),
        format!(
            "outbox-relay {} (commit {commit})",
            env!("CARGO_PKG_VERSION")
        )
    );
}

#[test]
fn bash_completion_is_valid_bash_and_completes_the_subcommands() {
    let (ok, script, stderr) = relay(&["completions", "bash"]);
    assert!(ok, "{stderr}");
    for sub in [
        "run",
        "replay",
        "check",
        "status",
        "prune",
        "completions",
        "man",
    ] {
        assert!(
            script.contains(&format!("outbox__relay__{sub}"))
                || script.contains(&format!(" {sub} ")),
            "bash completion lacks {sub}"
        );
    }
    let path = std::env::temp_dir().join(format!(
        "outbox-relay-completion-{}.bash",
        std::process::id()
    ));
    std::fs::write(&path, &script).expect("writing the script");
    // Load it and ask for the completions of `outbox-relay re`: what a user's Tab would get.
    let probe = format!(
        "source {}; COMP_WORDS=(outbox-relay re); COMP_CWORD=1; _outbox__relay outbox-relay re outbox-relay; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        path.display()
    );
    let out = Command::new("bash")
        .args(["-c", &probe])
        .output()
        .expect("bash runs");
    std::fs::remove_file(&path).ok();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let words: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert!(
        words.iter().any(|w| w == "replay") && words.iter().any(|w| w == "reset"),
        "completions of `re`: {words:?}"
    );
}

#[test]
fn completions_for_the_other_shells_and_an_unknown_shell() {
    for shell in ["zsh", "fish", "powershell", "elvish"] {
        let (ok, script, stderr) = relay(&["completions", shell]);
        assert!(ok, "{shell}: {stderr}");
        assert!(script.contains("replay"), "{shell} completion lacks replay");
    }
    let (ok, _, stderr) = relay(&["completions", "tcsh"]);
    assert!(!ok);
    assert!(stderr.contains("possible values"), "{stderr}");
}

#[test]
fn man_page_is_roff_and_every_page_it_names_is_written_with_dir() {
    let (ok, page, stderr) = relay(&["man"]);
    assert!(ok, "{stderr}");
    assert!(page.contains(".TH outbox-relay 1"), "{page}");
    let named: Vec<&str> = page
        .lines()
        .filter_map(|l| l.strip_suffix("(1)"))
        .filter(|l| l.starts_with("outbox\\-relay\\-"))
        .collect();
    for sub in ["run", "replay", "completions", "man"] {
        assert!(
            named.contains(&format!("outbox\\-relay\\-{sub}").as_str()),
            "the main page does not name {sub}: {named:?}"
        );
    }
    let dir = std::env::temp_dir().join(format!("outbox-relay-man-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("creating the folder");
    let (ok, _, stderr) = relay(&["man", "--dir", dir.to_str().expect("utf-8 path")]);
    assert!(ok, "{stderr}");
    for name in &named {
        let file = dir.join(format!("{}.1", name.replace("\\-", "-")));
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(text.contains(".TH outbox-relay-"), "{}", file.display());
    }
    assert!(dir.join("outbox-relay.1").exists());
    std::fs::remove_dir_all(&dir).ok();
    let (ok, _, stderr) = relay(&["man", "--dir", "/nonexistent/outbox-relay-man"]);
    assert!(!ok, "writing into a missing folder succeeded");
    assert!(stderr.contains("/nonexistent/outbox-relay-man"), "{stderr}");
}
