mod commands;
mod follow;
