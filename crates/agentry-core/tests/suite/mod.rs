mod engine;
mod features;
mod guards;
mod skills;
mod support;
mod templates;
mod tools;
