//! Chat templates: the Jinja template a model ships in `tokenizer.chat_template`.

use jiff::civil::DateTime;
use minijinja::{context, Environment, Error, ErrorKind, Value};
use pyramid_gguf::Metadata;

use crate::strftime;
use crate::vocab::{opt_str, KEY_BOS, KEY_CHAT_TEMPLATE, KEY_EOS, KEY_TOKENS};
use crate::{Result, TokenizerError};

const TEMPLATE_NAME: &str = "chat_template";

/// Template instructions one render may run. Real templates take a few dozen per message
/// (Qwen2.5's and SmolLM2's render a 1,000-message conversation within a tenth of this);
/// a template that would loop for hours stops after about a second on one core.
pub const TEMPLATE_FUEL: u64 = 20_000_000;

/// Text one render may produce: beyond any context a model supports, well below memory.
pub const MAX_RENDERED_BYTES: usize = 64 << 20;

/// One chat turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, or whatever else the template understands.
    pub role: String,
    pub content: String,
    /// The functions an assistant turn called.
    pub tool_calls: Vec<ToolCall>,
    /// The call a `tool` turn answers.
    pub tool_call_id: Option<String>,
    /// An assistant turn's thought, apart from its `content` (OpenAI-style clients send it
    /// back as `reasoning_content`; Qwen3's template prints it inside `<think>`).
    pub reasoning_content: Option<String>,
}

/// A function call in an assistant turn, as templates read it
/// (`tool_call.function.name`, `tool_call.function.arguments`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as a JSON value (templates print them with `tojson`).
    pub arguments: serde_json::Value,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            reasoning_content: None,
        }
    }

    /// The message as Hugging Face passes it to templates: `tool_calls`,
    /// `tool_call_id` and `reasoning_content` only where present.
    fn to_value(&self) -> Value {
        let mut fields = vec![
            ("role", Value::from(self.role.as_str())),
            ("content", Value::from(self.content.as_str())),
        ];
        if !self.tool_calls.is_empty() {
            let calls: Vec<Value> = self
                .tool_calls
                .iter()
                .map(|c| {
                    context! {
                        id => c.id,
                        type => "function",
                        function => context! {
                            name => c.name,
                            arguments => Value::from_serialize(&c.arguments),
                        },
                    }
                })
                .collect();
            fields.push(("tool_calls", Value::from(calls)));
        }
        if let Some(id) = &self.tool_call_id {
            fields.push(("tool_call_id", Value::from(id.as_str())));
        }
        if let Some(thought) = &self.reasoning_content {
            fields.push(("reasoning_content", Value::from(thought.as_str())));
        }
        Value::from_iter(fields)
    }
}

/// A compiled chat template, rendered the way Hugging Face's `apply_chat_template` does:
/// `trim_blocks` and `lstrip_blocks` on, Python string/dict methods available, a
/// `raise_exception(msg)` function, `strftime_now(format)` (the local time, see
/// `strftime.rs` for the directives), transformers' `tojson`, and `bos_token`,
/// `eos_token` and `tools` in scope.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("source_len", &self.source.len())
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token`/`eos_token` are the texts the template may print.
    pub fn new(
        source: impl Into<String>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<ChatTemplate> {
        ChatTemplate::with_clock(source, bos_token, eos_token, strftime::local_now)
    }

    /// [`ChatTemplate::new`] with `strftime_now` reading `now` rather than the local clock
    /// (tests render with a fixed date).
    pub(crate) fn with_clock(
        source: impl Into<String>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
        now: impl Fn() -> std::result::Result<DateTime, Error> + Send + Sync + 'static,
    ) -> Result<ChatTemplate> {
        let source = source.into();
        let mut env = Environment::new();
        // Jinja2 as configured by transformers: block tags do not leave their newline and
        // indentation behind, which the templates' whitespace relies on.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", move |format: &str| {
            strftime::strftime(now()?, format)
        });
        env.add_filter("tojson", crate::pyjson::tojson);
        env.set_fuel(Some(TEMPLATE_FUEL));
        // Debug info would put the template's variables (the conversation) into error
        // text sent to clients, and minijinja's renders of it can panic on a malformed
        // template's span (`{% for in x %}`, found by fuzzing): errors stay plain.
        env.set_debug(false);
        env.add_template_owned(TEMPLATE_NAME, without_generation_tags(&source))?;
        Ok(ChatTemplate {
            env,
            source,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
        })
    }

    /// The template in `tokenizer.chat_template`, with the BOS/EOS texts from the vocabulary.
    pub fn from_gguf(md: &Metadata) -> Result<ChatTemplate> {
        let source = opt_str(md, KEY_CHAT_TEMPLATE)?.ok_or(TokenizerError::NoChatTemplate)?;
        let token_text = |key: &str| -> String {
            let text = || {
                let id = usize::try_from(md.get(key)?.as_integer()?).ok()?;
                md.get_array(KEY_TOKENS).ok()?.get(id)?.as_str()
            };
            text().unwrap_or_default().to_owned()
        };
        ChatTemplate::new(source, token_text(KEY_BOS), token_text(KEY_EOS))
    }

    /// The Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the template reads a `tools` variable (Qwen2.5's does, SmolLM2's does not).
    pub fn takes_tools(&self) -> bool {
        self.source.contains("tools")
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends where the assistant's
    /// reply begins (e.g. after `<|im_start|>assistant\n`).
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with(
            messages,
            &[],
            &serde_json::Map::new(),
            add_generation_prompt,
        )
    }

    /// [`ChatTemplate::render`] with `tools`: OpenAI-style tool definitions
    /// (`{"type": "function", "function": {"name", "description", "parameters"}}`), which
    /// the template prints where the model expects them (no tools is `tools=None`), and
    /// `kwargs`: more variables for the template (`enable_thinking`, as transformers'
    /// `apply_chat_template(**kwargs)` passes them); the names above win over them.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        kwargs: &serde_json::Map<String, serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let messages: Vec<Value> = messages.iter().map(ChatMessage::to_value).collect();
        // transformers passes `tools=None` when no tools are given.
        let tools = if tools.is_empty() {
            Value::from(())
        } else {
            Value::from_serialize(tools)
        };
        let template = self.env.get_template(TEMPLATE_NAME)?;
        let ctx = context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
            tools => tools,
            ..Value::from_serialize(kwargs)
        };
        let mut out = CappedText::default();
        match template.render_captured_to(ctx, &mut out) {
            Ok(_) => String::from_utf8(out.text).map_err(|_| {
                TokenizerError::Template("the template produced invalid UTF-8".to_string())
            }),
            Err(_) if out.text.len() > MAX_RENDERED_BYTES => Err(TokenizerError::Template(
                format!("the rendered prompt exceeds {MAX_RENDERED_BYTES} bytes"),
            )),
            Err(err) if err.kind() == ErrorKind::OutOfFuel => Err(TokenizerError::Template(
                format!("rendering exceeded {TEMPLATE_FUEL} template steps (does it loop?)"),
            )),
            Err(err) => Err(err.into()),
        }
    }
}

/// A render's output, refusing to grow past [`MAX_RENDERED_BYTES`].
#[derive(Default)]
struct CappedText {
    text: Vec<u8>,
}

impl std::io::Write for CappedText {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.text.len() + buf.len() > MAX_RENDERED_BYTES {
            // Marks the overflow for `render`, which reports it instead of this error.
            self.text.resize(MAX_RENDERED_BYTES + 1, 0);
            return Err(std::io::Error::other("rendered prompt too long"));
        }
        self.text.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `source` with transformers' `{% generation %}…{% endgeneration %}` tags (they mark
/// the assistant's text for training masks, as SmolLM3's template does) as the block that
/// renders its body unchanged, `{% if true %}…{% endif %}`, whitespace control kept:
/// minijinja knows no such tag and would refuse the whole template.
fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(open) = rest.find("{%") {
        let (before, tag) = rest.split_at(open);
        out.push_str(before);
        let body = &tag[2..];
        let marker = body.len() - body.trim_start_matches(['-', '+']).len();
        let inner = body[marker..].trim_start();
        let keyword = ["endgeneration", "generation"].into_iter().find(|k| {
            inner.strip_prefix(k).is_some_and(|after| {
                let after = after.trim_start();
                after.starts_with("%}") || after.starts_with("-%}") || after.starts_with("+%}")
            })
        });
        match keyword {
            Some(keyword) => {
                out.push_str(&tag[..2 + marker]);
                out.push_str(if keyword == "generation" {
                    " if true"
                } else {
                    " endif"
                });
                rest = &inner[keyword.len()..];
            }
            None => {
                out.push_str("{%");
                rest = body;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Templates call `raise_exception("...")` to reject conversations they cannot format.
fn raise_exception(message: String) -> std::result::Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn a_template_that_loops_too_long_runs_out_of_fuel() {
        let looping =
            "{% for i in range(99999) %}{% for j in range(99999) %}x{% endfor %}{% endfor %}";
        let template = ChatTemplate::new(looping, "", "").unwrap();
        let start = std::time::Instant::now();
        let err = template.render(&[], true).unwrap_err().to_string();
        assert!(err.contains("template steps"), "{err}");
        // Not a timing assertion on speed: a hang would never get here at all.
        println!("fuel ran out after {:?}", start.elapsed());
    }

    #[test]
    fn a_loop_without_a_variable_does_not_panic() {
        // With minijinja's debug info on (as in every debug build) this panicked while
        // formatting the render's error; whatever it renders to, it must return.
        for source in [
            "{% for in messages %}{% endfor %}",
            "{%for in s|tojson%}{%endfor%}",
        ] {
            if let Ok(template) = ChatTemplate::new(source, "", "") {
                let _ = template.render(&[ChatMessage::new("user", "hi")], true);
            }
        }
    }

    #[test]
    fn a_template_producing_too_much_text_is_refused() {
        let huge = "{% for i in range(1000) %}{{ 'x' * 100000 }}{% endfor %}";
        let err = ChatTemplate::new(huge, "", "")
            .unwrap()
            .render(&[], true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("exceeds"), "{err}");
    }

    #[test]
    fn renders_chatml_with_generation_prompt() {
        let t = ChatTemplate::new(CHATML, "", "<|im_end|>").unwrap();
        let out = t.render(&[ChatMessage::new("user", "hi")], true).unwrap();
        assert_eq!(
            out,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn keyword_variables_reach_the_template_and_the_request_names_win() {
        let src = "{% if enable_thinking is defined and not enable_thinking %}/no_think {% endif %}{{ messages[0].content }}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let msgs = [ChatMessage::new("user", "hi")];
        let kwargs = |v: serde_json::Value| v.as_object().unwrap().clone();
        let render = |k| t.render_with(&msgs, &[], &k, true).unwrap();
        assert_eq!(render(kwargs(serde_json::json!({}))), "hi");
        assert_eq!(
            render(kwargs(serde_json::json!({"enable_thinking": false}))),
            "/no_think hi"
        );
        assert_eq!(
            render(kwargs(serde_json::json!({"messages": [{"content": "x"}]}))),
            "hi"
        );
    }

    #[test]
    fn python_methods_and_raise_exception() {
        let src = "{% if messages[0].role.startswith('sys') %}{{ raise_exception('no system: ' + messages[0].content.strip()) }}{% endif %}{{ bos_token }}{{ messages[0].content.strip() }}";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        assert_eq!(
            t.render(&[ChatMessage::new("user", "  x  ")], false)
                .unwrap(),
            "<s>x"
        );
        let err = t
            .render(&[ChatMessage::new("system", " y ")], false)
            .unwrap_err();
        assert!(err.to_string().contains("no system: y"), "{err}");
    }

    #[test]
    fn generation_tags_become_plain_blocks_and_nothing_else_changes() {
        assert_eq!(
            without_generation_tags(
                "{%generation%}a{%- endgeneration +%}{% if generation_x %}{{ '{%' }}{% endif %}{%"
            ),
            "{% if true%}a{%- endif +%}{% if generation_x %}{{ '{%' }}{% endif %}{%"
        );
    }

    /// Llama 3.2's template without its tool parts: the date block (3.1's and 3.3's read
    /// the date the same way), the system header and plain turns.
    const LLAMA_3_2_HEAD: &str = r#"{{- bos_token }}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}"#;

    fn on_23_july_2024() -> std::result::Result<DateTime, Error> {
        Ok(jiff::civil::date(2024, 7, 23).at(10, 0, 0, 0))
    }

    #[test]
    fn llama_3_2_prints_todays_date_from_strftime_now() {
        let t = ChatTemplate::with_clock(LLAMA_3_2_HEAD, "<|begin_of_text|>", "", on_23_july_2024)
            .unwrap();
        let msgs = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "hi"),
        ];
        assert_eq!(
            t.render(&msgs, false).unwrap(),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n\
             Cutting Knowledge Date: December 2023\nToday Date: 23 Jul 2024\n\n\
             Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
        );
        // A caller's `date_string` (transformers' kwargs) wins, as the template reads it first.
        let kwargs = serde_json::json!({"date_string": "01 Jan 2025"});
        let out = t
            .render_with(&msgs, &[], kwargs.as_object().unwrap(), false)
            .unwrap();
        assert!(out.contains("Today Date: 01 Jan 2025\n"), "{out}");
        // The real clock renders too (whatever today is).
        let out = ChatTemplate::new(LLAMA_3_2_HEAD, "", "")
            .unwrap()
            .render(&msgs, false)
            .unwrap();
        assert!(!out.contains("26 Jul 2024"), "{out}");
    }

    #[test]
    fn smollm3_date_line_renders() {
        let src = "Today Date: {{ strftime_now('%d %B %Y') }}";
        let t = ChatTemplate::with_clock(src, "", "", on_23_july_2024).unwrap();
        assert_eq!(t.render(&[], false).unwrap(), "Today Date: 23 July 2024");
    }

    #[test]
    fn an_unsupported_strftime_directive_is_a_template_error_naming_it() {
        let t = ChatTemplate::with_clock("{{ strftime_now('%Y-%W') }}", "", "", on_23_july_2024)
            .unwrap();
        let err = t.render(&[], false).unwrap_err();
        assert!(matches!(err, TokenizerError::Template(_)), "{err}");
        assert!(err.to_string().contains("'%W'"), "{err}");
    }

    #[test]
    fn syntax_error_is_reported() {
        let err = ChatTemplate::new("{% if %}", "", "").unwrap_err();
        assert!(matches!(err, TokenizerError::Template(_)), "{err}");
    }

    #[test]
    fn missing_template_is_a_clear_error() {
        let err = ChatTemplate::from_gguf(&Metadata::new()).unwrap_err();
        assert!(matches!(err, TokenizerError::NoChatTemplate), "{err}");
    }
}
