//! What operators see and use: the console, the CLI, run lists, timelines, troubleshooting, operations.

mod console;
mod operations;
mod operator_cli;
mod run_list;
mod timeline;
mod traces;
mod troubleshooting;
