mod chat;
mod crash;
mod run;
mod sessions;
