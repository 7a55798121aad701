mod chunking;
mod fixtures;
mod requests;
mod retry;
mod scripted;
mod support;
