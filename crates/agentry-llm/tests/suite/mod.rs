mod chunking;
mod fixtures;
mod redirects;
mod requests;
mod retry;
mod scripted;
mod support;
