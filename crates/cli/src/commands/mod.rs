pub mod bench;
pub mod chat;
pub mod inspect;
pub mod models;
pub mod replay;
pub mod run;
pub mod serve;
pub mod tokenize;
