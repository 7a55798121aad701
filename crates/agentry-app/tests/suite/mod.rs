mod commands;
mod follow;
mod queue;
