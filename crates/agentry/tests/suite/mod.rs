mod chat;
mod run;
