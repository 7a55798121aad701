mod chunking;
mod context_window;
mod fixtures;
mod requests;
mod retry;
mod scripted;
mod support;
