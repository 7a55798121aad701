mod config;
mod infer;
mod ops;
mod sessions;
mod support;
