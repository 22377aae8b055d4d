//! What operators see and use: the console, the CLI, run lists, timelines, troubleshooting, operations,
//! renamed settings.

mod console;
mod operations;
mod operator_cli;
mod renamed_settings;
mod run_list;
mod timeline;
mod traces;
mod troubleshooting;
