//! The `run_code` tool: Python in the session sandbox's kernel ([`super::kernel`]), with state
//! kept between calls; charts come back to the model as images.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agentry_sandbox::{Sandbox, SandboxPool};
use agentry_types::{ImageSource, ToolResultPart};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use super::kernel::{self, CodeCall, CodeOutput, CodeResult, KernelError, KernelHome, KernelSlot};
use super::{RUN_CODE, ShellToolsConfig, head_and_tail, sandbox_for};
use agentry_core::tool::{FunctionTool, ToolContext, ToolError, ToolOutput};

/// Arguments of `run_code`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RunCodeArguments {
    /// Python code. Variables, imports and functions stay for the next call; the value of the
    /// last line is shown, and so are matplotlib figures (`plt.show()`).
    code: String,
    /// Seconds before the code is interrupted (default 120); the kernel and its variables stay.
    #[serde(default)]
    timeout_secs: Option<u64>,
}

/// Each workspace's kernel, with the sandbox that holds its process.
type Kernels = Arc<Mutex<HashMap<PathBuf, (Sandbox, Arc<KernelSlot>)>>>;

/// The `run_code` tool.
pub(super) fn run_code(
    sandboxes: SandboxPool,
    config: Arc<ShellToolsConfig>,
    python: Arc<str>,
) -> FunctionTool {
    let kernels: Kernels = Arc::default();
    let timeout = config.max_timeout + Duration::from_secs(30);
    FunctionTool::new(
        RUN_CODE,
        "Runs Python code in a Jupyter kernel in this session's sandbox, like a notebook cell: \
         variables, imports and functions stay between calls, the workspace is the working \
         directory (read and write its files, such as CSVs), and the result has what the code \
         printed, the value of its last line, its error with the traceback, and its charts \
         (matplotlib figures, shown with plt.show()) as images. pandas, numpy and matplotlib \
         are there when the sandbox's Python has them.",
        move |arguments: RunCodeArguments, context: ToolContext| {
            let sandboxes = sandboxes.clone();
            let config = Arc::clone(&config);
            let kernels = Arc::clone(&kernels);
            let python = Arc::clone(&python);
            async move { run(&sandboxes, &config, &kernels, &python, arguments, context).await }
        },
    )
    .with_timeout(timeout)
}

async fn run(
    sandboxes: &SandboxPool,
    config: &ShellToolsConfig,
    kernels: &Kernels,
    python: &str,
    arguments: RunCodeArguments,
    context: ToolContext,
) -> Result<ToolOutput, ToolError> {
    if arguments.code.trim().is_empty() {
        return Err(ToolError::InvalidArguments("the code is empty".into()));
    }
    if arguments.code.len() > kernel::MAX_CODE_BYTES {
        return Err(ToolError::InvalidArguments(format!(
            "the code is over {} bytes",
            kernel::MAX_CODE_BYTES
        )));
    }
    let timeout = config.timeout(arguments.timeout_secs)?;
    let sandbox = sandbox_for(sandboxes, &context).await?;
    let workspace = sandbox.workspace().to_path_buf();
    let slot = {
        let mut kernels = kernels.lock().unwrap_or_else(PoisonError::into_inner);
        // The kernels of sandboxes that closed (sessions gone idle) go, with their connections.
        kernels.retain(|_, (sandbox, _)| sandbox.closed_reason().is_none());
        let (_, slot) = kernels
            .entry(workspace.clone())
            .or_insert_with(|| (sandbox.clone(), Arc::default()));
        Arc::clone(slot)
    };
    let home = KernelHome {
        sandbox: &sandbox,
        workspace: &workspace,
        mount: &sandboxes.template().workspace_mount,
        python,
    };
    let call = CodeCall {
        code: arguments.code,
        timeout,
        live: None,
    };
    let result = tokio::select! {
        biased;
        () = context.cancel.cancelled() => return Err(ToolError::Cancelled),
        result = kernel::run(home, &slot, call) => result,
    };
    match result {
        Ok(result) => Ok(render(&result, config.max_output_bytes)),
        Err(KernelError::Sandbox(error)) => {
            Err(ToolError::Failed(format!("the sandbox refused: {error}")))
        }
        Err(error) => Err(ToolError::Failed(error.to_string())),
    }
}

/// The result as the model reads it: text (output, the last value, the error) and the images.
fn render(result: &CodeResult, max_text: usize) -> ToolOutput {
    let mut text = String::new();
    let mut images = Vec::new();
    if result.kernel_started {
        text.push_str("(a new kernel: no earlier variables)\n");
    }
    for output in &result.outputs {
        match output {
            CodeOutput::Stream { name, text: chunk } => {
                if name == "stderr" {
                    let _ = write!(text, "[stderr] {chunk}");
                } else {
                    text.push_str(chunk);
                }
            }
            CodeOutput::DisplayData { data } | CodeOutput::Result { data } => {
                if let Some(Value::String(png)) = data.get("image/png") {
                    images.push(ToolResultPart::Image {
                        source: ImageSource::Base64 {
                            media_type: "image/png".into(),
                            data: png.trim().to_owned(),
                        },
                    });
                    text.push_str("[a chart, attached as an image]\n");
                } else if let Some(Value::String(plain)) = data.get("text/plain") {
                    let _ = writeln!(text, "{plain}");
                }
            }
        }
    }
    if let Some(error) = &result.error {
        let _ = writeln!(text, "{}", error.traceback.join("\n"));
        if error.traceback.is_empty() {
            let _ = writeln!(text, "{}: {}", error.name, error.value);
        }
    }
    if result.timed_out {
        text.push_str("(interrupted at the timeout; the kernel and its variables stay)\n");
    }
    if text.trim().is_empty() {
        text.push_str("(no output)");
    }
    let (shown, _) = head_and_tail(text.as_bytes(), max_text);
    let mut content = vec![ToolResultPart::Text { text: shown }];
    content.extend(images);
    ToolOutput::parts(content, result.error.is_some())
}
