mod shell_tools;
mod support;
mod tools;
mod workspace_tools;
