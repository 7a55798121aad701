mod agents;
mod config;
mod infer;
mod openapi;
mod ops;
mod sessions;
mod support;
