mod chat;
mod crash;
mod run;
mod serve;
mod sessions;
