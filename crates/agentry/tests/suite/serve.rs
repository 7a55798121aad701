//! `agentry serve`, the README's main command, end to end.

use std::process::Stdio;
use std::time::Duration;

use agentry_testkit::{MockProvider, Reply, ScriptedTurn};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn serve_answers_registers_a_model_runs_and_stops_on_sigterm() {
    let home = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("--home")
        .arg(home.path())
        .args(["serve", &format!("127.0.0.1:{port}")])
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("AGENTRY_DATABASE_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(20), stdout.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        first,
        format!("Agentry is listening on http://127.0.0.1:{port}")
    );
    let console = stdout.next_line().await.unwrap().unwrap();
    assert_eq!(
        console,
        format!("console: open http://127.0.0.1:{port}/ in a browser")
    );
    let second = stdout.next_line().await.unwrap().unwrap();
    assert!(
        second.contains(home.path().to_str().unwrap()) && second.contains("sqlite"),
        "{second}"
    );
    // This host gives the native sandbox, and serve says it uses it.
    let sandbox = stdout.next_line().await.unwrap().unwrap();
    assert_eq!(sandbox, "sandbox: native");
    // Without network flags, `fetch` is off, as sandboxes' network is.
    let fetch = stdout.next_line().await.unwrap().unwrap();
    assert!(fetch.starts_with("fetch: off"), "{fetch}");
    // Which requests it answers, and what asks for approval by default.
    let requests = stdout.next_line().await.unwrap().unwrap();
    assert!(
        requests.starts_with("requests: Host must be a loopback name or IP address"),
        "{requests}"
    );
    let approvals = stdout.next_line().await.unwrap().unwrap();
    assert!(
        approvals.starts_with("approvals: tools that run on the host ask a person"),
        "{approvals}"
    );
    let hint = stdout.next_line().await.unwrap().unwrap();
    assert!(hint.contains("No model yet"), "{hint}");

    let http = agentry_llm::http_client(Duration::from_secs(5)).unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let ready: Value = http
        .get(format!("{base}/readyz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ready["status"], "ready");

    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Served.")));
    let created = http
        .post(format!("{base}/v1/models"))
        .json(&json!({"id": "m", "protocol": "openai", "base_url": mock.openai_base_url(), "model_name": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status().as_u16(), 201);
    let answer: Value = http
        .post(format!("{base}/v1/infer"))
        .json(&json!({"session_id": "new", "text": "hello"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["text"], "Served.", "{answer}");

    // Templates compile and render in a memory-capped renderer, this binary re-executed: a
    // template that doubles a 100 MB string five times is refused with the reason, and the server's
    // own memory stays where it was.
    let pid = child.id().unwrap() as i32;
    let peak_kib = || -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap()
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kib| kib.parse().ok())
            .unwrap()
    };
    let before = peak_kib();
    let bomb = http
        .post(format!("{base}/v1/prompt-templates"))
        .json(&json!({"name": "doubling", "template":
            format!("{{% set a = 'x' * 100000000 %}}{}{{{{ a }}}}", "{% set a = a ~ a %}".repeat(5))}))
        .send()
        .await
        .unwrap();
    assert_eq!(bomb.status().as_u16(), 400);
    let body: Value = bomb.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("bytes of memory"), "{message}");
    let grown = peak_kib().saturating_sub(before);
    assert!(
        grown < 80 * 1024,
        "the server's peak memory grew by {grown} KiB"
    );
    let good = http
        .post(format!("{base}/v1/prompt-templates"))
        .json(&json!({"name": "greeting", "template": "Hello {{ name }}"}))
        .send()
        .await
        .unwrap();
    assert_eq!(good.status().as_u16(), 201);

    // SIGTERM (sent with kill(1)): a graceful stop.
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(exit.success(), "{exit:?}");
    // The session is still there for the next start.
    let list = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("--home")
        .arg(home.path())
        .args(["sessions", "list"])
        .output()
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&list.stdout).contains("hello"));
}

#[tokio::test]
async fn serve_refuses_a_public_address_without_a_key() {
    let home = tempfile::tempdir().unwrap();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("--home")
        .arg(home.path())
        .args(["serve", "0.0.0.0:0"])
        .env_remove("AGENTRY_DATABASE_URL")
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("without authentication") && stderr.contains("agentry keys create"),
        "{stderr}"
    );
    // With a key it is allowed (checked by binding only: the key turns auth on).
    let key = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("--home")
        .arg(home.path())
        .args(["keys", "create", "--label", "test"])
        .output()
        .await
        .unwrap();
    assert!(key.status.success());
    assert!(
        String::from_utf8_lossy(&key.stdout)
            .trim()
            .starts_with("agk_")
    );
    let listed = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("--home")
        .arg(home.path())
        .args(["keys", "list"])
        .output()
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&listed.stdout).contains("active"));
}

/// `serve --require-key` makes the first admin key at start, prints it once, and requires it
/// from the first request on; a restart keeps the key and prints none (the first security
/// review's S9: a server without keys trusts every local process).
#[tokio::test]
async fn require_key_makes_and_prints_the_first_key_once() {
    let home = tempfile::tempdir().unwrap();
    let start = || {
        let port = free_port();
        let mut child = super::processes::serve(home.path(), port, &["--require-key"]);
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        (port, child, stdout, stderr)
    };
    // Reads stderr until the banner is out on stdout; the key printed, if any.
    async fn key_printed(
        stdout: tokio::process::ChildStdout,
        stderr: tokio::process::ChildStderr,
    ) -> Option<String> {
        let mut out = BufReader::new(stdout).lines();
        let deadline = std::time::Duration::from_secs(20);
        tokio::time::timeout(deadline, async {
            while let Some(line) = out.next_line().await.unwrap() {
                if line.starts_with("Agentry is listening") {
                    break;
                }
            }
        })
        .await
        .expect("serve started");
        // Everything said on stderr before the banner is in its buffer by now.
        let mut err = BufReader::new(stderr).lines();
        let mut key = None;
        while let Ok(Ok(Some(line))) =
            tokio::time::timeout(std::time::Duration::from_millis(300), err.next_line()).await
        {
            if let Some(found) = line.trim().strip_prefix("Authorization: Bearer ") {
                key = Some(found.to_owned());
            }
        }
        key
    }
    let http = agentry_llm::http_client(std::time::Duration::from_secs(5)).unwrap();
    let (port, mut child, stdout, stderr) = start();
    let key = key_printed(stdout, stderr)
        .await
        .expect("the key is printed");
    assert!(key.starts_with("agk_"), "{key}");
    let url = format!("http://127.0.0.1:{port}/v1/sessions");
    let refused = http.get(&url).send().await.unwrap();
    assert_eq!(refused.status().as_u16(), 401, "no request without the key");
    let allowed = http.get(&url).bearer_auth(&key).send().await.unwrap();
    assert_eq!(allowed.status().as_u16(), 200);
    child.kill().await.unwrap();
    child.wait().await.unwrap();
    // A restart: the key stands, and no new one is made or printed.
    let (port, mut child, stdout, stderr) = start();
    assert_eq!(key_printed(stdout, stderr).await, None);
    let url = format!("http://127.0.0.1:{port}/v1/sessions");
    let allowed = http.get(&url).bearer_auth(&key).send().await.unwrap();
    assert_eq!(allowed.status().as_u16(), 200);
    child.kill().await.unwrap();
}

/// Issue 48: a first start with a provider key in the environment imports it as a secret bound
/// to the provider's host, says so, and the banner's command registers the model as printed.
#[tokio::test]
async fn a_first_start_imports_the_provider_key_and_its_banner_command_works() {
    let home = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = super::processes::serve_command(home.path(), port, &[])
        .env("OPENAI_API_KEY", "sk-from-the-environment-0123")
        .env_remove("ANTHROPIC_API_KEY")
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut banner = Vec::new();
    while let Ok(Some(line)) = tokio::time::timeout(Duration::from_secs(20), stdout.next_line())
        .await
        .unwrap()
    {
        let last = line.starts_with("Then: ");
        banner.push(line);
        if last {
            break;
        }
    }
    let text = banner.join("\n");
    assert!(
        text.contains(
            "secrets: OPENAI_API_KEY imported from the environment (sealed in the data folder, \
             sent only to api.openai.com)"
        ),
        "{text}"
    );
    assert!(!text.contains("sk-from-the-environment"), "{text}");
    // The banner's own command, run as printed, registers the model.
    let command = banner
        .iter()
        .find(|line| line.contains("/v1/models") && line.contains("OPENAI_API_KEY"))
        .expect("a command for the OpenAI model")
        .trim()
        .to_owned();
    let output = tokio::process::Command::new("sh")
        .args(["-c", &command])
        .env_remove("OPENAI_API_KEY")
        .output()
        .await
        .unwrap();
    let created: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(created["id"], "gpt", "{created}");
    let http = agentry_llm::http_client(Duration::from_secs(5)).unwrap();
    let secrets: Value = http
        .get(format!("http://127.0.0.1:{port}/v1/env"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        secrets["secrets"][0]["hosts"],
        json!(["api.openai.com"]),
        "{secrets}"
    );
    child.kill().await.unwrap();
}

/// Issue 48: after `kill -9`, a supervisor's immediate restart on the same data folder serves
/// at once (it holds the folder's lock, so the incarnation recorded there is gone), even with a
/// lease of a minute, and the node list shows one node, the new incarnation.
#[tokio::test]
async fn a_restart_right_after_kill_9_serves_at_once() {
    let home = tempfile::tempdir().unwrap();
    let port = super::processes::free_port();
    let lease = ["--lease-secs", "60"];
    let mut first = super::processes::serve(home.path(), port, &lease);
    super::processes::listening(&mut first).await;
    first.start_kill().unwrap();
    first.wait().await.unwrap();
    let started = std::time::Instant::now();
    let mut second = super::processes::serve(home.path(), port, &lease);
    let mut stdout = BufReader::new(second.stdout.take().unwrap()).lines();
    let mut stderr = BufReader::new(second.stderr.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), stdout.next_line())
        .await
        .unwrap()
        .unwrap();
    let Some(line) = line else {
        let mut said = Vec::new();
        while let Ok(Some(line)) = stderr.next_line().await {
            said.push(line);
        }
        panic!("the restart exited: {said:?}");
    };
    assert!(line.starts_with("Agentry is listening"), "{line}");
    assert!(started.elapsed() < Duration::from_secs(10));
    tokio::spawn(async move { while let Ok(Some(_)) = stdout.next_line().await {} });
    let http = agentry_llm::http_client(Duration::from_secs(5)).unwrap();
    let cluster: Value = http
        .get(format!("http://127.0.0.1:{port}/v1/cluster"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let nodes = cluster["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 1, "{cluster}");
    assert_eq!(nodes[0]["state"], "alive", "{cluster}");
    second.kill().await.unwrap();
}

/// Issue 48: a data folder whose disk fills up. `serve` runs on a 4 MiB tmpfs of its own (a
/// user and mount namespace, as the sandbox suite needs anyway), filled from outside through
/// `/proc/PID/root`. New runs, streamed or not, are then refused with a typed 507 `storage_full`
/// (they answered 404 "not found: session" before, and a stream 200 then nothing), readiness says `storage_full`, and nothing half-written is
/// left: once the filler is gone the node is ready again within a heartbeat and serves, and the
/// only session is the one made after.
#[tokio::test]
async fn a_full_disk_is_a_typed_507_readiness_says_so_and_nothing_is_half_written() {
    let mount = tempfile::tempdir().unwrap();
    let port = free_port();
    let script = "mount -t tmpfs -o size=4m tmpfs \"$1\" && exec \"$2\" --home \"$1/home\" \
                  serve \"127.0.0.1:$3\" --lease-secs 4";
    let mut child = tokio::process::Command::new("unshare")
        .args([
            "--user",
            "--map-root-user",
            "--mount",
            "sh",
            "-c",
            script,
            "sh",
        ])
        .arg(mount.path())
        .arg(env!("CARGO_BIN_EXE_agentry"))
        .arg(port.to_string())
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("AGENTRY_DATABASE_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(20), stdout.next_line())
        .await
        .unwrap()
        .unwrap();
    let Some(first) = first else {
        let mut said = String::new();
        let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
        while let Ok(Some(line)) = stderr.next_line().await {
            said.push_str(&line);
            said.push('\n');
        }
        panic!("serve on a tmpfs of its own did not start (user namespaces needed): {said}");
    };
    assert!(first.starts_with("Agentry is listening"), "{first}");
    tokio::spawn(async move { while let Ok(Some(_)) = stdout.next_line().await {} });
    let base = format!("http://127.0.0.1:{port}");
    let http = agentry_llm::http_client(Duration::from_secs(30)).unwrap();
    let mock = MockProvider::start().await.unwrap();
    mock.set_fallback(Reply::scripted(ScriptedTurn::text("Answered.")));
    let created = http
        .post(format!("{base}/v1/models"))
        .json(&json!({"id": "m", "protocol": "openai", "base_url": mock.openai_base_url(), "model_name": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status().as_u16(), 201);

    // Fill the tmpfs, as seen from inside the server's mount namespace.
    let pid = child.id().unwrap();
    let filler = format!("/proc/{pid}/root{}/filler", mount.path().display());
    {
        use std::io::Write as _;
        let mut file = std::fs::File::create(&filler).unwrap();
        let block = vec![0u8; 64 * 1024];
        loop {
            match file.write_all(&block) {
                Ok(()) => {}
                Err(error) if error.raw_os_error() == Some(28) => break,
                Err(error) => panic!("filling the tmpfs: {error}"),
            }
        }
        let _ = file.sync_all();
    }

    let long = "x".repeat(4000);
    const TURNS: usize = 8;
    let (mut refused, mut refused_streams) = (0, 0);
    for turn in 0..TURNS {
        // Every other turn streamed: a stream is refused the same way, before it begins.
        let streamed = turn % 2 == 1;
        let path = if streamed { "infer/stream" } else { "infer" };
        let response = http
            .post(format!("{base}/v1/{path}"))
            .json(&json!({"session_id": "new", "text": format!("turn {turn} {long}")}))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        // Either there was room for it after all, or a typed refusal: never a 404 or a 500.
        match status {
            200 if streamed => assert!(text.contains("event: run.finished"), "{text}"),
            200 => assert!(text.contains("Answered."), "{text}"),
            507 => {
                let body: Value = serde_json::from_str(&text).unwrap();
                assert_eq!(body["error"]["code"], "storage_full", "{body}");
                refused += 1;
                refused_streams += usize::from(streamed);
            }
            other => panic!("a run on a full disk answered {other}: {text}"),
        }
    }
    assert!(
        refused_streams > 0,
        "no streamed run was refused on a full disk"
    );
    assert!(
        refused > refused_streams,
        "no run was refused on a full disk"
    );
    let ready = http.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(ready.status().as_u16(), 503);
    let ready: Value = ready.json().await.unwrap();
    assert_eq!(ready["error"]["code"], "storage_full", "{ready}");

    // Room again: ready within a heartbeat (a second here), and serving.
    std::fs::remove_file(&filler).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let ready = http.get(format!("{base}/readyz")).send().await.unwrap();
        if ready.status().is_success() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not ready again after the disk had room"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let sessions_before: Value = http
        .get(format!("{base}/v1/sessions"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let kept_before = sessions_before["sessions"].as_array().unwrap().len();
    assert_eq!(kept_before, TURNS - refused, "{sessions_before}");
    let answer: Value = http
        .post(format!("{base}/v1/infer"))
        .json(&json!({"session_id": "new", "text": "and now?"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["text"], "Answered.", "{answer}");
    let sessions: Value = http
        .get(format!("{base}/v1/sessions"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let sessions = sessions["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), kept_before + 1);
    // Every session kept is whole: its run finished and its answer is there.
    for session in sessions {
        let id = session["id"].as_str().unwrap();
        let detail: Value = http
            .get(format!("{base}/v1/sessions/{id}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert!(detail.to_string().contains("Answered."), "{detail}");
    }
    child.kill().await.unwrap();
}
