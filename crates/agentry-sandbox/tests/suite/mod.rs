mod common;
mod escape_fs;
mod escape_net;
mod escape_priv;
mod lifecycle;
mod local;
mod native_basic;
mod resources;
