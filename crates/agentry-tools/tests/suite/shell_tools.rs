//! The sandboxed tools: `exec` (exit codes, capped output saved to the workspace, timeouts,
//! background processes), `terminal` (state kept across calls, commands still running, several
//! terminals), command tools run in the sandbox, the host-side file tools and the sandbox
//! sharing one workspace, and a model run that uses `exec`.

use std::fs;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agentry_core::RunRequest;
use agentry_core::tool::{Tool, ToolContext, ToolError, ToolOutput, ToolRegistry};
use agentry_sandbox::{BackendKind, SandboxConfig, SandboxPool, SandboxSpec};
use agentry_testkit::{MockProvider, Reply, ScriptedTurn};
use agentry_tools::shell::pty::Opener;
use agentry_tools::{
    CommandTool, CommandToolConfig, PtyTerminals, ShellToolsConfig, WorkspaceToolsConfig,
    shell_tools, workspace_tools,
};
use agentry_types::{RunStopReason, ToolResultPart};
use anyhow::{Context as _, Result, bail, ensure};
use serde_json::{Value, json};

use super::support::{PROTOCOLS, builder, limits, result_texts, run_collect};

const TIMEOUT: Duration = Duration::from_secs(30);

/// The sandbox agent executable the workspace builds (`agentry-sandbox-init`, beside the test
/// binary's folder).
fn init_exe() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .context("no target folder")?;
    let init = dir.join("agentry-sandbox-init");
    ensure!(
        init.exists(),
        "{} is missing: build it with `cargo build -p agentry-sandbox --bins` (the workspace \
         test run does)",
        init.display()
    );
    Ok(init)
}

fn pool() -> Result<SandboxPool> {
    let backend = agentry_sandbox::backend(SandboxConfig {
        backend: BackendKind::Native,
        init_exe: Some(init_exe()?),
        ..SandboxConfig::default()
    })?;
    Ok(SandboxPool::new(backend, SandboxSpec::new("/unused")))
}

struct Fixture {
    _temp: tempfile::TempDir,
    workspace: PathBuf,
    pool: SandboxPool,
    registry: ToolRegistry,
    terminals: PtyTerminals,
}

impl Fixture {
    fn new() -> Result<Self> {
        let config = ShellToolsConfig {
            max_output_bytes: 300,
            ..ShellToolsConfig::default()
        };
        Self::with_config(config)
    }

    fn with_config(config: ShellToolsConfig) -> Result<Self> {
        let temp = tempfile::tempdir()?;
        let workspace = temp.path().join("workspace");
        fs::create_dir(&workspace)?;
        let pool = pool()?;
        let mut registry = ToolRegistry::default();
        let terminals = PtyTerminals::default();
        for tool in shell_tools(pool.clone(), terminals.clone(), config) {
            registry.register_arc(tool)?;
        }
        for tool in workspace_tools(WorkspaceToolsConfig::default()) {
            registry.register_arc(tool)?;
        }
        Ok(Self {
            _temp: temp,
            workspace,
            pool,
            registry,
            terminals,
        })
    }

    async fn call(&self, name: &str, arguments: Value) -> Result<ToolOutput, ToolError> {
        let context = ToolContext::detached("call-1").with_workspace(&self.workspace);
        self.registry
            .invoke(name, arguments, context, TIMEOUT)
            .await
    }

    async fn text(&self, name: &str, arguments: Value) -> Result<String> {
        let output = self.call(name, arguments).await?;
        text_of(&output)
    }
}

fn text_of(output: &ToolOutput) -> Result<String> {
    match output.content.as_slice() {
        [ToolResultPart::Text { text }] => Ok(text.clone()),
        other => bail!("expected one text part, got {other:?}"),
    }
}

#[tokio::test]
async fn exec_reports_exit_code_stdout_and_stderr() -> Result<()> {
    let f = Fixture::new()?;
    let text = f
        .text("exec", json!({"command": "echo hello; pwd; id -u"}))
        .await?;
    ensure!(text.starts_with("exit code 0"), "{text}");
    ensure!(
        text.contains("--- stdout ---\nhello\n/workspace\n0"),
        "{text}"
    );
    let text = f
        .text("exec", json!({"command": "echo oops >&2; exit 3"}))
        .await?;
    ensure!(text.starts_with("exit code 3"), "{text}");
    ensure!(text.contains("--- stderr ---\noops"), "{text}");
    ensure!(!text.contains("--- stdout ---"), "{text}");
    // The sandbox is the session's: files persist between calls, in the host workspace.
    f.text(
        "exec",
        json!({"command": "mkdir -p sub && echo kept > sub/a.txt"}),
    )
    .await?;
    assert_eq!(fs::read_to_string(f.workspace.join("sub/a.txt"))?, "kept\n");
    let text = f
        .text("exec", json!({"command": "cat a.txt", "cwd": "sub"}))
        .await?;
    ensure!(text.contains("kept"), "{text}");
    // No host secret in the environment, no network.
    let text = f
        .text(
            "exec",
            json!({"command": "env | grep -c AGENTRY_SANDBOX_CANARY; python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 80), timeout=2)' 2>&1 | tail -1"}),
        )
        .await?;
    ensure!(text.contains("\n0\n"), "{text}");
    ensure!(text.contains("unreachable"), "{text}");
    f.pool.close_all().await;
    Ok(())
}

#[tokio::test]
async fn exec_shortens_long_output_and_saves_all_of_it() -> Result<()> {
    let f = Fixture::new()?;
    let text = f.text("exec", json!({"command": "seq 1 5000"})).await?;
    ensure!(text.contains("bytes left out"), "{text}");
    ensure!(text.contains("\n1\n2\n"), "the head is kept: {text}");
    ensure!(text.contains("4999\n5000"), "the tail is kept: {text}");
    ensure!(
        text.contains(".agentry/outputs/call-1.stdout.txt"),
        "{text}"
    );
    let saved = fs::read_to_string(f.workspace.join(".agentry/outputs/call-1.stdout.txt"))?;
    let expected: String = (1..=5000).map(|n| format!("{n}\n")).collect();
    assert_eq!(saved, expected);
    // The model can read it back with read_file.
    let part = f
        .text(
            "read_file",
            json!({"path": ".agentry/outputs/call-1.stdout.txt"}),
        )
        .await;
    ensure!(part.is_ok(), "{part:?}");
    f.pool.close_all().await;
    Ok(())
}

#[tokio::test]
async fn exec_timeout_kills_the_command_and_says_so() -> Result<()> {
    let f = Fixture::new()?;
    let started = std::time::Instant::now();
    let text = f
        .text(
            "exec",
            json!({"command": "(sleep 30 &); sleep 30", "timeout_secs": 1}),
        )
        .await?;
    ensure!(text.starts_with("timed out after 1 s"), "{text}");
    ensure!(started.elapsed() < Duration::from_secs(10));
    // Nothing it started is left.
    let text = f
        .text(
            "exec",
            json!({"command": "ps -eo args | grep -c '^sleep 30'"}),
        )
        .await?;
    ensure!(text.contains("--- stdout ---\n0"), "{text}");
    // Bad arguments are refused with a reason.
    let error = f
        .call("exec", json!({"command": "true", "timeout_secs": 0}))
        .await;
    ensure!(
        matches!(error, Err(ToolError::InvalidArguments(_))),
        "{error:?}"
    );
    let error = f.call("exec", json!({"command": "  "})).await;
    ensure!(
        matches!(error, Err(ToolError::InvalidArguments(_))),
        "{error:?}"
    );
    f.pool.close_all().await;
    Ok(())
}

#[tokio::test]
async fn exec_background_keeps_running_and_logs() -> Result<()> {
    let f = Fixture::new()?;
    let text = f
        .text(
            "exec",
            json!({"command": "for i in 1 2 3; do echo tick $i; sleep 0.1; done; sleep 60", "background": true}),
        )
        .await?;
    ensure!(
        text.starts_with("started in the background (pid "),
        "{text}"
    );
    let pid: String = text
        .trim_start_matches("started in the background (pid ")
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    ensure!(!pid.is_empty(), "{text}");
    let log = f.workspace.join(".agentry/outputs/call-1.background.log");
    let mut content = String::new();
    for _ in 0..50 {
        content = fs::read_to_string(&log).unwrap_or_default();
        if content.contains("tick 3") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(content, "tick 1\ntick 2\ntick 3\n");
    let text = f
        .text(
            "exec",
            json!({"command": format!("kill -0 {pid} && echo alive")}),
        )
        .await?;
    ensure!(text.contains("alive"), "{text}");
    let text = f
        .text("exec", json!({"command": format!("kill {pid}; sleep 0.2; kill -0 {pid} 2>/dev/null || echo gone")}))
        .await?;
    ensure!(text.contains("gone"), "{text}");
    f.pool.close_all().await;
    Ok(())
}

#[tokio::test]
async fn terminal_keeps_state_between_calls() -> Result<()> {
    let f = Fixture::new()?;
    let text = f
        .text(
            "terminal",
            json!({"input": "mkdir -p deep/er && cd deep/er && export GREETING=hi && f() { echo \"fn $1\"; }"}),
        )
        .await?;
    assert_eq!(text, "[exit code 0]");
    let text = f
        .text("terminal", json!({"input": "pwd; echo $GREETING; f x"}))
        .await?;
    assert_eq!(text, "/workspace/deep/er\nhi\nfn x\n[exit code 0]");
    let text = f.text("terminal", json!({"input": "false"})).await?;
    assert_eq!(text, "[exit code 1]");
    // stderr arrives in the same stream, in order.
    let text = f
        .text(
            "terminal",
            json!({"input": "echo one; echo two >&2; echo three"}),
        )
        .await?;
    assert_eq!(text, "one\ntwo\nthree\n[exit code 0]");
    // Another terminal has its own state.
    let text = f
        .text(
            "terminal",
            json!({"terminal": "other", "input": "pwd; echo \"[$GREETING]\""}),
        )
        .await?;
    assert_eq!(text, "/workspace\n[]\n[exit code 0]");
    // Closing one leaves the other; reopening starts afresh.
    let text = f
        .text("terminal", json!({"terminal": "other", "close": true}))
        .await?;
    assert_eq!(text, "terminal \"other\" closed");
    let text = f.text("terminal", json!({"input": "pwd"})).await?;
    assert_eq!(text, "/workspace/deep/er\n[exit code 0]");
    f.pool.close_all().await;
    Ok(())
}

/// The agent's terminals are real terminals in the shared registry: programs see a TTY, what
/// they print reaches a person following the terminal (colours and all) while escape sequences
/// never reach the model, a person's keystrokes reach the same shell, and closing it takes it
/// off the registry.
#[tokio::test]
async fn the_agents_terminals_are_ptys_people_can_follow() -> Result<()> {
    let f = Fixture::new()?;
    let text = f
        .text(
            "terminal",
            json!({"input": "[ -t 0 ] && [ -t 1 ] && echo on-a-tty; printf '\\033[1;31mred\\033[0m\\n'; stty size"}),
        )
        .await?;
    assert_eq!(text, "on-a-tty\nred\n50 200\n[exit code 0]");
    let listed = f.terminals.all();
    ensure!(listed.len() == 1, "{listed:?}");
    let pty = Arc::clone(&listed[0]);
    ensure!(*pty.opener() == Opener::Agent("main".into()));
    let (scrollback, mut feed) = pty.follow();
    let shown = String::from_utf8_lossy(&scrollback).into_owned();
    ensure!(shown.contains("\x1b[1;31mred\x1b[0m"), "{shown:?}");
    f.text("terminal", json!({"input": "echo for-the-person"}))
        .await?;
    let mut seen = String::new();
    while !seen.contains("for-the-person") {
        let chunk = tokio::time::timeout(Duration::from_secs(5), feed.recv())
            .await?
            .context("the terminal's feed ended")?;
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    pty.input(b"export FROM_PERSON=typed\n").await?;
    let text = f
        .text("terminal", json!({"input": "echo $FROM_PERSON"}))
        .await?;
    assert_eq!(text, "typed\n[exit code 0]");
    f.text("terminal", json!({"close": true})).await?;
    ensure!(f.terminals.all().is_empty());
    ensure!(pty.ended().await.is_some());
    f.pool.close_all().await;
    Ok(())
}

#[tokio::test]
async fn terminal_returns_while_a_command_runs_and_reads_on() -> Result<()> {
    let f = Fixture::new()?;
    let text = f
        .text(
            "terminal",
            json!({"input": "echo begin; sleep 2; echo end", "wait_secs": 0.5}),
        )
        .await?;
    ensure!(text.starts_with("begin\n[still running after"), "{text}");
    let text = f.text("terminal", json!({"wait_secs": 10})).await?;
    assert_eq!(text, "end\n[exit code 0]");
    let text = f.text("terminal", json!({"wait_secs": 0.2})).await?;
    assert_eq!(text, "[no command running]");
    // A shell that exits is reported, and the next call starts a new one.
    let text = f.text("terminal", json!({"input": "exit 7"})).await?;
    ensure!(text.contains("[the shell ended (exit code 7)"), "{text}");
    let text = f.text("terminal", json!({"input": "echo again"})).await?;
    assert_eq!(text, "again\n[exit code 0]");
    let error = f
        .call("terminal", json!({"terminal": "../x", "input": "ls"}))
        .await;
    ensure!(
        matches!(error, Err(ToolError::InvalidArguments(_))),
        "{error:?}"
    );
    f.pool.close_all().await;
    Ok(())
}

#[tokio::test]
async fn terminals_are_capped_per_session() -> Result<()> {
    let f = Fixture::with_config(ShellToolsConfig {
        max_terminals: 2,
        ..ShellToolsConfig::default()
    })?;
    f.text("terminal", json!({"terminal": "a", "input": "true"}))
        .await?;
    f.text("terminal", json!({"terminal": "b", "input": "true"}))
        .await?;
    let error = f
        .call("terminal", json!({"terminal": "c", "input": "true"}))
        .await;
    match error {
        Err(ToolError::Failed(message)) => ensure!(message.contains("close one"), "{message}"),
        other => bail!("expected a refusal, got {other:?}"),
    }
    f.pool.close_all().await;
    Ok(())
}

#[tokio::test]
async fn host_file_tools_and_the_sandbox_share_the_workspace() -> Result<()> {
    let f = Fixture::new()?;
    f.text(
        "write_file",
        json!({"path": "src/notes.txt", "content": "from the host\n"}),
    )
    .await?;
    // The sandbox user may change what the host-side tools wrote (as root they hand new files
    // to the workspace's owner).
    let text = f
        .text(
            "exec",
            json!({"command": "echo from the sandbox >> src/notes.txt && touch src/new && cat src/notes.txt"}),
        )
        .await?;
    ensure!(text.starts_with("exit code 0"), "{text}");
    let text = f
        .text("read_file", json!({"path": "src/notes.txt"}))
        .await?;
    assert_eq!(text, "from the host\nfrom the sandbox\n");
    f.pool.close_all().await;
    Ok(())
}

#[tokio::test]
async fn command_tools_run_in_the_sandbox() -> Result<()> {
    let f = Fixture::new()?;
    let script = "import json, os, sys\n\
                  args = json.load(sys.stdin)\n\
                  open('made-by-tool.txt', 'w').write('x')\n\
                  print(json.dumps({'sum': args['a'] + args['b'], 'cwd': os.getcwd(), \
                  'uid': os.getuid(), 'canary': os.environ.get('AGENTRY_SANDBOX_CANARY'), \
                  'mode': os.environ.get('MODE'), 'host_root': os.path.exists('/root/.cargo')}))";
    let tool = CommandTool::new(CommandToolConfig {
        name: "add".into(),
        description: "adds".into(),
        parameters: json!({"type": "object"}),
        program: "/usr/bin/python3".into(),
        args: vec!["-c".into(), script.into()],
        env: vec![("MODE".into(), "sandboxed".into())],
        timeout: None,
        max_output_bytes: 4096,
    })?
    .in_sandbox(f.pool.clone());
    let context = ToolContext::detached("c").with_workspace(&f.workspace);
    let output = tool.call(json!({"a": 2, "b": 40}), context).await?;
    let value = match output.content.as_slice() {
        [ToolResultPart::Json { value }] => value.clone(),
        other => bail!("expected JSON, got {other:?}"),
    };
    assert_eq!(
        value,
        json!({"sum": 42, "cwd": "/workspace", "uid": 0, "canary": null, "mode": "sandboxed", "host_root": false})
    );
    ensure!(f.workspace.join("made-by-tool.txt").exists());
    // A program the sandbox cannot see fails with a reason.
    let missing = CommandTool::new(CommandToolConfig {
        name: "missing".into(),
        description: String::new(),
        parameters: json!({"type": "object"}),
        program: "/opt/nowhere/tool".into(),
        args: Vec::new(),
        env: Vec::new(),
        timeout: None,
        max_output_bytes: 4096,
    })?
    .in_sandbox(f.pool.clone());
    let context = ToolContext::detached("c").with_workspace(&f.workspace);
    match missing.call(json!({}), context).await {
        Err(ToolError::Failed(message)) => {
            ensure!(message.contains("not found in the sandbox"), "{message}")
        }
        other => bail!("expected a failure, got {other:?}"),
    }
    // Without a workspace (a stateless run, a direct call) the call gets a scratch sandbox of
    // its own, closed when it ends.
    let before = f.pool.len();
    let scratch = tool
        .call(json!({"a": 1, "b": 1}), ToolContext::detached("c"))
        .await;
    ensure!(scratch.is_ok(), "{scratch:?}");
    ensure!(f.pool.len() == before, "the scratch sandbox was left open");
    f.pool.close_all().await;
    Ok(())
}

#[tokio::test]
async fn a_model_runs_commands_in_its_sandbox() -> Result<()> {
    let pool = pool()?;
    for protocol in PROTOCOLS {
        let workspace = tempfile::tempdir()?;
        let mock = MockProvider::start().await?;
        mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
            "exec",
            json!({"command": "echo 'print(6 * 7)' > calc.py && python3 calc.py"}),
        )));
        mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
            "terminal",
            json!({"input": "cd /tmp && pwd"}),
        )));
        mock.enqueue(Reply::scripted(ScriptedTurn::text("42.")));
        let mut builder = builder(&mock, protocol);
        for tool in shell_tools(
            pool.clone(),
            PtyTerminals::default(),
            ShellToolsConfig::default(),
        ) {
            builder.tool_arc(tool)?;
        }
        builder.limits(limits());
        let request = RunRequest::text("compute").with_workspace(workspace.path());
        let (events, output) = run_collect(&builder.build(), request).await;
        assert_eq!(output.stop_reason, RunStopReason::Completed, "{protocol:?}");
        let results = result_texts(&events);
        ensure!(results.len() == 2, "{results:?}");
        ensure!(
            results[0].0.starts_with("exit code 0") && results[0].0.ends_with("--- stdout ---\n42"),
            "{results:?}"
        );
        assert_eq!(results[1], ("/tmp\n[exit code 0]".to_owned(), false));
        ensure!(workspace.path().join("calc.py").exists());
        // The model saw the command's output in its next request.
        ensure!(mock.requests()[1].body.to_string().contains("42"));
        if let Err(violations) = mock.check_protocol() {
            bail!("{protocol:?}: {violations:?}");
        }
        pool.close(workspace.path()).await;
    }
    ensure!(pool.is_empty());
    Ok(())
}

/// `run_code`: Python in the session sandbox's Jupyter kernel (the stock data-analysis venv of
/// `scripts/install-mcp-servers`, shown read-only): state across calls, the last value, an
/// error reported as the tool's error with its traceback, a chart attached as a PNG image.
#[tokio::test]
async fn run_code_keeps_state_and_returns_charts_as_images() -> Result<()> {
    let venv = agentry_testkit::mcp::McpServers::locate()?
        .root()
        .canonicalize()?
        .join("kernel");
    ensure!(
        venv.join("bin/python").exists(),
        "{} is missing: run scripts/install-mcp-servers",
        venv.display()
    );
    let temp = tempfile::tempdir()?;
    let workspace = temp.path().join("workspace");
    fs::create_dir(&workspace)?;
    let backend = agentry_sandbox::backend(SandboxConfig {
        backend: BackendKind::Native,
        init_exe: Some(init_exe()?),
        ..SandboxConfig::default()
    })?;
    let mut template = SandboxSpec::new("/unused");
    template.ro_mounts.push(venv.clone());
    let pool = SandboxPool::new(backend, template);
    let mut registry = ToolRegistry::default();
    let config = ShellToolsConfig {
        kernel_python: venv.join("bin/python").to_string_lossy().into_owned(),
        ..ShellToolsConfig::default()
    };
    for tool in shell_tools(pool.clone(), PtyTerminals::default(), config) {
        registry.register_arc(tool)?;
    }
    let call = |code: &str| {
        let context = ToolContext::detached("call-1").with_workspace(&workspace);
        registry.invoke("run_code", json!({"code": code}), context, TIMEOUT)
    };
    fs::write(workspace.join("data.csv"), "n,square\n1,1\n2,4\n3,9\n")?;

    let first = text_of(&call("import pandas as pd\ndf = pd.read_csv('data.csv')").await?)?;
    ensure!(first.contains("a new kernel"), "{first}");
    let second = call("print(df['square'].sum())\nlen(df)").await?;
    ensure!(!second.is_error, "{second:?}");
    let text = text_of(&second)?;
    ensure!(text == "14\n3\n", "{text:?}");

    let failed = call("df['missing']").await?;
    ensure!(
        failed.is_error,
        "an exception is the tool's error: {failed:?}"
    );
    let text = text_of(&failed)?;
    ensure!(
        text.contains("KeyError") && text.contains("missing"),
        "{text}"
    );

    let chart =
        call("import matplotlib.pyplot as plt\nplt.plot(df['n'], df['square'])\nplt.show()")
            .await?;
    ensure!(!chart.is_error, "{chart:?}");
    let [
        ToolResultPart::Text { text },
        ToolResultPart::Image { source },
    ] = chart.content.as_slice()
    else {
        bail!("expected a text and an image, got {:?}", chart.content);
    };
    ensure!(text.contains("a chart"), "{text}");
    let agentry_types::ImageSource::Base64 { media_type, data } = source else {
        bail!("expected a base64 image, got {source:?}");
    };
    ensure!(media_type == "image/png", "{media_type}");
    use base64::Engine as _;
    let png = base64::engine::general_purpose::STANDARD.decode(data)?;
    ensure!(png.starts_with(b"\x89PNG"), "not a PNG");
    pool.close_all().await;
    Ok(())
}
