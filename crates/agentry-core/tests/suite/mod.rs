mod engine;
mod features;
mod guards;
mod sessions;
mod skills;
mod support;
mod templates;
mod tools;
