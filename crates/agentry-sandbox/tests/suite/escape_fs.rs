//! Filesystem escapes, through commands and through the file API.

use super::common::*;

#[tokio::test]
async fn writes_outside_the_workspace_fail() {
    let (sb, dir) = sandbox().await;
    for target in [
        "/etc/evil",
        "/usr/evil",
        "/evil",
        "/proc/evil",
        "/dev/evil",
        "/usr/bin/python3",
    ] {
        let out = sh(&sb, &format!("echo x > {target}")).await;
        assert_ne!(out.status.code, Some(0), "writing {target} must fail");
    }
    // The workspace and /tmp are writable (control).
    assert!(
        sh(&sb, "echo x > /workspace/ok && echo x > /tmp/ok")
            .await
            .status
            .success()
    );
    assert!(dir.path().join("ok").exists());
    // Through the file API as well.
    for target in ["/etc/evil", "/usr/evil", "../../../../etc/evil", "/evil"] {
        assert!(sb.write_file(target, b"x").await.is_err(), "{target}");
    }
    assert!(!std::path::Path::new("/etc/evil").exists() && !std::path::Path::new("/evil").exists());
    sb.close().await;
}

#[tokio::test]
async fn host_secrets_are_unreadable() {
    let (sb, _dir) = sandbox().await;
    let out = sh(&sb, "cat /etc/shadow").await;
    assert_ne!(out.status.code, Some(0));
    assert!(sb.read_file("/etc/shadow", 1 << 20).await.is_err());
    assert!(
        sb.read_file("../../../../etc/shadow", 1 << 20)
            .await
            .is_err()
    );
    // /etc is synthesised: not the host's users.
    let passwd = sb.read_file("/etc/passwd", 1 << 20).await.unwrap();
    assert_ne!(passwd, std::fs::read("/etc/passwd").unwrap());
    // The runtime's environment: no process inside shows any of its variables; host pids are
    // invisible.
    let base = [
        "PATH", "HOME", "LANG", "TMPDIR", "PWD", "SHLVL", "_", "OLDPWD",
    ];
    let host_vars: Vec<String> = std::env::vars()
        .filter(|(k, _)| !base.contains(&k.as_str()))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    assert!(
        !host_vars.is_empty(),
        "the runtime has variables of its own"
    );
    let out = sh(
        &sb,
        "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; ls /proc | grep -c '^[0-9]'",
    )
    .await;
    let text = out.stdout_str();
    for var in &host_vars {
        assert!(
            !text.lines().any(|l| l == var),
            "{var} leaked into the sandbox"
        );
    }
    let pids: usize = text.lines().last().unwrap().trim().parse().unwrap();
    assert!(
        pids < 10,
        "only the sandbox's own processes are visible ({pids})"
    );
    let host_pid = std::process::id();
    // The runtime's pid means nothing inside: no such process, or one of the sandbox's own.
    if let Ok(environ) = sb
        .read_file(&format!("/proc/{host_pid}/environ"), 1 << 20)
        .await
    {
        let environ = String::from_utf8_lossy(&environ).into_owned();
        assert!(
            !host_vars
                .iter()
                .any(|v| environ.split('\0').any(|l| l == v)),
            "{environ}"
        );
    }
    // Nothing of /root or /home exists inside.
    assert_ne!(sh(&sb, "ls /root /home").await.status.code, Some(0));
    sb.close().await;
}

#[tokio::test]
async fn symlink_and_hardlink_tricks_fail() {
    let (sb, dir) = sandbox().await;
    // Symlinks made inside resolve inside: to the sandbox's (absent) /etc/shadow, not the host's.
    let out = sh(&sb, "ln -s /etc/shadow s && ln -s / r && ln -s ../../../../../../etc/shadow t && cat s r/etc/shadow t").await;
    assert_ne!(out.status.code, Some(0));
    assert!(out.stdout_str().is_empty());
    for path in ["s", "t", "r/etc/shadow", "r/root/.bashrc"] {
        assert!(sb.read_file(path, 1 << 20).await.is_err(), "{path}");
    }
    // A symlink planted on the host side pointing at a host file: the API still resolves inside.
    std::os::unix::fs::symlink("/etc/hostname", dir.path().join("planted")).unwrap();
    let inside = sb.read_file("planted", 1 << 20).await.unwrap();
    assert_eq!(
        inside, b"sandbox\n",
        "the link resolved to the sandbox's /etc/hostname"
    );
    // Writing through a symlink to a system file fails.
    let out = sh(&sb, "ln -s /etc/passwd p && ln -s /usr/bin/python3 q").await;
    assert!(out.status.success());
    assert!(sb.write_file("p", b"evil").await.is_err());
    assert!(sb.write_file("q", b"evil").await.is_err());
    // Hard links to files outside the workspace: other mounts, refused.
    for src in ["/etc/passwd", "/usr/bin/python3", "/etc/hosts"] {
        let out = sh(&sb, &format!("ln {src} h")).await;
        assert_ne!(out.status.code, Some(0), "hard link to {src}");
    }
    sb.close().await;
}

/// Host-wide /proc files are masked (empty), and PID 1's command line does not show where the
/// sandbox's binary lives on the host.
#[tokio::test]
async fn host_wide_proc_files_are_masked_and_pid1_hides_its_host_path() {
    let (sb, _dir) = sandbox().await;
    // The host has them (this test would prove nothing otherwise).
    assert!(
        !std::fs::read_to_string("/proc/kallsyms")
            .unwrap()
            .is_empty()
    );
    for file in [
        "/proc/kallsyms",
        "/proc/keys",
        "/proc/timer_list",
        "/proc/modules",
    ] {
        if !std::path::Path::new(file).exists() {
            continue;
        }
        let out = sh(&sb, &format!("wc -c < {file}")).await;
        assert!(out.status.success(), "{file}: {}", out.stderr_str());
        assert_eq!(out.stdout_str().trim(), "0", "{file} is readable inside");
        assert!(
            sb.read_file(file, 1 << 20)
                .await
                .map_or(true, |bytes| bytes.is_empty()),
            "{file} through the file API"
        );
    }
    // A masked folder is empty and read-only.
    if std::path::Path::new("/proc/driver").is_dir() {
        let out = sh(&sb, "ls -A /proc/driver | wc -l; touch /proc/driver/x").await;
        assert_eq!(out.stdout_str().trim(), "0");
        assert_ne!(out.status.code, Some(0));
    }
    // Other /proc files still work.
    assert!(
        sh(&sb, "cat /proc/self/status /proc/meminfo > /dev/null")
            .await
            .status
            .success()
    );

    let cmdline = sh(&sb, "tr '\\0' ' ' < /proc/1/cmdline").await.stdout_str();
    let host_path = init_exe().display().to_string();
    assert!(!cmdline.contains(&host_path), "{cmdline}");
    assert!(!cmdline.contains('/'), "{cmdline}");
    assert!(cmdline.starts_with("agentry-sandbox"), "{cmdline}");
    sb.close().await;
}

/// `/usr/local` is the host's unless the spec hides it; hidden, it is empty and read-only.
#[tokio::test]
async fn usr_local_can_be_hidden() {
    let host_entries = std::fs::read_dir("/usr/local").map_or(0, |dir| dir.count());
    assert!(
        host_entries > 0,
        "the host's /usr/local is empty: nothing to hide"
    );
    let (shown, _dir) = sandbox().await;
    let out = sh(&shown, "ls -A /usr/local | wc -l").await;
    assert_eq!(out.stdout_str().trim(), host_entries.to_string());
    shown.close().await;

    let (hidden, _dir) = sandbox_with(|spec| spec.hide_usr_local = true).await;
    let out = sh(&hidden, "ls -A /usr/local | wc -l").await;
    assert_eq!(out.stdout_str().trim(), "0", "{}", out.stderr_str());
    assert_ne!(sh(&hidden, "touch /usr/local/x").await.status.code, Some(0));
    // The rest of /usr is still there.
    assert!(sh(&hidden, "/usr/bin/env true").await.status.success());
    hidden.close().await;
}

/// Issue 48: a read-only mount under /tmp (a repository cloned there) is visible inside the
/// sandbox, on top of the sandbox's own /tmp, and read-only; one that does not exist is an
/// error, never silently left out.
#[tokio::test]
async fn a_read_only_mount_under_tmp_is_visible_and_read_only() {
    let host = tempfile::Builder::new()
        .prefix("agentry-ro-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::write(host.path().join("tool.txt"), "from the host\n").unwrap();
    let path = host.path().to_path_buf();
    let (sb, _dir) = sandbox_with(|spec| spec.ro_mounts.push(path.clone())).await;
    let inside = host.path().join("tool.txt");
    let out = sh(&sb, &format!("cat {}", inside.display())).await;
    assert_eq!(out.stdout_str(), "from the host\n", "{}", out.stderr_str());
    let out = sh(&sb, &format!("echo x > {}", inside.display())).await;
    assert_ne!(out.status.code, Some(0), "the mount is writable");
    // The sandbox's /tmp is still its own and writable.
    assert!(
        sh(&sb, "touch /tmp/mine && ls /tmp/mine")
            .await
            .status
            .success()
    );
    sb.close().await;
    assert_eq!(
        std::fs::read_to_string(host.path().join("tool.txt")).unwrap(),
        "from the host\n"
    );

    let missing = host.path().join("absent");
    let workspace = tempfile::tempdir().unwrap();
    let mut spec = agentry_sandbox::SandboxSpec::new(workspace.path());
    spec.ro_mounts.push(missing.clone());
    let refused = native().create(spec).await;
    let Err(error) = refused else {
        panic!("a missing read-only mount is refused");
    };
    let error = error.to_string();
    assert!(error.contains(&missing.display().to_string()), "{error}");
}
