mod config;
mod infer;
mod sessions;
mod support;
