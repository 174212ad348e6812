pub mod bench;
pub mod chat;
mod chat_remote;
pub mod inspect;
pub mod models;
pub mod replay;
pub mod run;
pub mod serve;
pub mod tokenize;
