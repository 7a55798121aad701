mod config;
mod everything;
mod servers;
mod supervision;
mod support;
