mod config;
mod everything;
mod redirects;
mod servers;
mod supervision;
mod support;
