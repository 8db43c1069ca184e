//! The `#[bspweb::main]` attribute of the bspweb guest SDK.
//!
//! Use it through the SDK (`bspweb::main`), not directly. It keeps the
//! annotated `async fn` unchanged and adds the module's one entry point, the
//! `bspweb_resume` export the host calls, which hands the function to the SDK's
//! runtime:
//!
//! ```text
//! #[doc(hidden)]
//! #[unsafe(no_mangle)]
//! pub extern "C" fn bspweb_resume() -> i32 { ::bspweb::__rt::resume(NAME) }
//! ```
//!
//! The macro is written without `syn`/`quote`: it only has to find the
//! function's name and check that the item is an `async fn`.

use proc_macro::{Delimiter, Group, Ident, Literal, Punct, Spacing, Span, TokenStream, TokenTree};

const USAGE: &str = "write `#[bspweb::main] async fn main(bsp: &mut bspweb::Bsp, args: Args) -> bspweb::Result<()> { ... }`";

/// Marks the `async fn` that is a BSP program's main function.
///
/// The function takes `&mut Bsp` and the job's arguments (any
/// `serde::de::DeserializeOwned` type, `()` for none) and returns `()` or a
/// `Result<(), E>` with `E: Display`. See the `bspweb` crate documentation.
#[proc_macro_attribute]
pub fn main(attr: TokenStream, item: TokenStream) -> TokenStream {
    if let Some(first) = attr.into_iter().next() {
        return with_error(item, first.span(), "#[bspweb::main] takes no arguments");
    }
    match find_async_fn_name(item.clone()) {
        Ok(name) => {
            let mut out = item;
            out.extend(resume_export(&name));
            out
        }
        Err((span, msg)) => with_error(item, span, &msg),
    }
}

/// Walks the item's leading tokens (attributes, visibility, qualifiers) up to
/// `fn NAME` and returns `NAME`, or an error with the span to blame.
fn find_async_fn_name(item: TokenStream) -> Result<Ident, (Span, String)> {
    let mut tokens = item.into_iter().peekable();
    let mut seen_async = false;
    let mut last_span = Span::call_site();
    while let Some(tt) = tokens.next() {
        last_span = tt.span();
        match &tt {
            // An outer attribute: `#` followed by `[...]`.
            TokenTree::Punct(p) if p.as_char() == '#' => {
                if let Some(TokenTree::Group(g)) = tokens.peek()
                    && g.delimiter() == Delimiter::Bracket
                {
                    tokens.next();
                    continue;
                }
                return Err((
                    tt.span(),
                    format!("#[bspweb::main] must be applied to an `async fn`; {USAGE}"),
                ));
            }
            TokenTree::Ident(id) => match id.to_string().as_str() {
                "pub" => {
                    // `pub(crate)` and friends.
                    if let Some(TokenTree::Group(g)) = tokens.peek()
                        && g.delimiter() == Delimiter::Parenthesis
                    {
                        tokens.next();
                    }
                }
                "async" => seen_async = true,
                "unsafe" | "extern" | "const" => {
                    return Err((
                        id.span(),
                        format!(
                            "#[bspweb::main] cannot be applied to a function marked `{id}`; {USAGE}"
                        ),
                    ));
                }
                "fn" => {
                    if !seen_async {
                        return Err((
                            id.span(),
                            format!(
                                "#[bspweb::main] must be applied to an `async fn`, because `bsp.sync().await` suspends the program at every superstep; {USAGE}"
                            ),
                        ));
                    }
                    return match tokens.next() {
                        Some(TokenTree::Ident(name)) => {
                            if let Some(TokenTree::Punct(p)) = tokens.peek()
                                && p.as_char() == '<'
                            {
                                return Err((
                                    p.span(),
                                    format!(
                                        "#[bspweb::main] cannot be applied to a generic function; {USAGE}"
                                    ),
                                ));
                            }
                            Ok(name)
                        }
                        other => Err((
                            other.map_or(id.span(), |t| t.span()),
                            format!("expected the function's name after `fn`; {USAGE}"),
                        )),
                    };
                }
                _ => {
                    return Err((
                        id.span(),
                        format!("#[bspweb::main] must be applied to an `async fn`; {USAGE}"),
                    ));
                }
            },
            _ => {
                return Err((
                    tt.span(),
                    format!("#[bspweb::main] must be applied to an `async fn`; {USAGE}"),
                ));
            }
        }
    }
    Err((
        last_span,
        format!("#[bspweb::main] must be applied to an `async fn`; {USAGE}"),
    ))
}

/// `#[doc(hidden)] #[unsafe(no_mangle)] pub extern "C" fn bspweb_resume() -> i32 { ::bspweb::__rt::resume(NAME) }`
fn resume_export(name: &Ident) -> TokenStream {
    let head: TokenStream =
        "#[doc(hidden)] #[unsafe(no_mangle)] pub extern \"C\" fn bspweb_resume() -> i32"
            .parse()
            .expect("the resume export's signature is valid Rust");
    let mut body: TokenStream = "::bspweb::__rt::resume"
        .parse()
        .expect("the runtime path is valid Rust");
    body.extend([TokenTree::Group(Group::new(
        Delimiter::Parenthesis,
        TokenStream::from(TokenTree::Ident(name.clone())),
    ))]);
    let mut out = head;
    out.extend([TokenTree::Group(Group::new(Delimiter::Brace, body))]);
    out
}

/// The item unchanged (so that its own errors and uses still make sense),
/// followed by `::core::compile_error!("msg");` pointing at `span`.
fn with_error(item: TokenStream, span: Span, msg: &str) -> TokenStream {
    let mut out = item;
    let punct = |c: char, spacing: Spacing| {
        let mut p = Punct::new(c, spacing);
        p.set_span(span);
        TokenTree::Punct(p)
    };
    let mut lit = Literal::string(msg);
    lit.set_span(span);
    let mut args = Group::new(
        Delimiter::Parenthesis,
        TokenStream::from(TokenTree::Literal(lit)),
    );
    args.set_span(span);
    out.extend([
        punct(':', Spacing::Joint),
        punct(':', Spacing::Alone),
        TokenTree::Ident(Ident::new("core", span)),
        punct(':', Spacing::Joint),
        punct(':', Spacing::Alone),
        TokenTree::Ident(Ident::new("compile_error", span)),
        punct('!', Spacing::Alone),
        TokenTree::Group(args),
        punct(';', Spacing::Alone),
    ]);
    out
}
