mod chunking;
mod context_window;
mod fixtures;
mod redirects;
mod requests;
mod retry;
mod scripted;
mod support;
