"""The prompt-injection families: what each looks like once ``normalize`` has taken the disguise off.

Two kinds of rule:

- **Phrase families** (override, reassignment, extraction, concealment, addressing the model, exfiltration):
  written once in plain English and matched on the *squash* view (letters only, leetspeak folded), so
  ``I g n o r e  a l l  p r e v i o u s`` and ``1gn0r3 4ll pr3v10u5`` are the same phrase. A phrase family is a
  small grammar (verb, fillers, qualifier, object) rather than a list of sentences, so paraphrases that keep
  the shape are caught: "pay no attention to the earlier guidance", "your prior directives are now void".
- **Structural families** (chat-template tokens, role-turn markers, tool-call markup, JSON-RPC messages,
  directive tags, markdown-image exfiltration): matched on the *fold* view, where punctuation and lines survive.

All patterns are RE2 (linear time). Role-turn markers and JSON-RPC messages need context to tell an injection
from a transcript or a protocol log, so their patterns only nominate candidates; ``structure`` decides.
"""

from __future__ import annotations

import re
from typing import Any

import re2

from bastion.sanitize.normalize import skeleton


def _alt(*words: str) -> str:
    return "(?:" + "|".join(words) + ")"


# -- phrase families (squash view) -----------------------------------------------------------------------------

_POLITE = _alt("please", "kindly", "now", "just", "simply", "completely", "totally", "entirely", "fully",
               "immediately", "also")
# Verbs that only mean "stop following" (strong), and verbs that do so only next to "previous instructions".
_IGNORE_STRONG = _alt(
    "ignor(?:e|ing)", "disregard(?:ing)?", "forg(?:et|etting|ot)(?: about)?", "abandon(?:ing)?",
    "neglect(?:ing)?", "overlook(?:ing)?", "dismiss(?:ing)?", "never mind", "nevermind", "set aside", "put aside",
    "pay no (?:attention|heed|mind) to", "(?:do not|dont|never|stop|no longer|cease|quit) (?:follow(?:ing)?|"
    "obey(?:ing)?|adher(?:e|ing) to|comply(?:ing)? with|listen(?:ing)? to|heed(?:ing)?|respect(?:ing)?|"
    "abid(?:e|ing) by)",
)
_IGNORE = _alt(_IGNORE_STRONG, "overrid(?:e|ing)", "overwrit(?:e|ing)", "bypass(?:ing)?", "discard(?:ing)?",
               "throw (?:out|away)", "scrap", "ditch", "skip(?:ping)?", "drop(?:ping)?", "cancel(?:ing)?")
_FILLER = _alt("all", "any", "every", "each", "the", "your", "my", "of", "these", "those", "that", "this", "its",
               "such", "other", "entire", "whole", "and", "or", "also", "just", "completely", "everything",
               "anything", "in", "from", "set", "kind", "sort", "type")
_QUAL = _alt("previous(?:ly)?", "prior", "preceding", "above", "earlier", "foregoing", "former", "original",
             "initial", "old(?:er)?", "system", "developer", "safety", "past", "pre ?set", "pre ?programmed",
             "programmed", "built ?in", "hidden", "ethical", "moderation", "operator", "aforementioned",
             "above ?mentioned", "earlier ?given", "ur previous", "underlying", "current system")
# After the object: where the instructions came from.
_POST = _alt("above", "before", "earlier", "previously", "so far", "prior to this", "before this", "wrote",
             "gave you", "were given", "you were given", "you received", "you got", "came before", "come before",
             "you were told", "you were configured with", "you were set up with", "you were trained (?:on|with)",
             "you have been given", "you ve been given", "provided to you", "given to you", "listed above",
             "stated above", "written above", "in your system prompt", "in the system prompt")
_OBJ = _alt("instructions?", "prompts?", "directions?", "rules?", "guidelines?", "guidance", "context",
            "messages?", "orders?", "commands?", "directives?", "constraints?", "restrictions?", "guardrails?",
            "polic(?:y|ies)", "programming", "training", "conversation", "tasks?", "inputs?", "persona",
            "limitations?", "filters?", "safeguards?", "protocols?", "boundaries", "principles", "ethics",
            "text", "requests?", "assignments?", "briefing", "setup", "configuration")
_OBJ_STRONG = _alt("instructions?", "prompts?", "guidelines?", "directives?", "programming", "training",
                   "polic(?:y|ies)",
                   "guardrails?", "restrictions?", "safeguards?", "system prompt", "rules", "orders",
                   "ethical guidelines", "content polic(?:y|ies)")
_COPULA = _alt("are", "is", "have been", "has been", "were", "was", "shall be", "should be", "must be",
               "will be", "are to be", "is to be", "now")
_VOID = _alt("null and void", "void", "null", "cancel(?:l)?ed", "revoked", "rescinded", "obsolete", "superseded",
             "overridden", "overruled", "invalid(?:ated)?", "suspended", "lifted", "disabled", "deactivated",
             "withdrawn", "no longer (?:valid|apply|applies|in effect|relevant|binding|active|in force)",
             "not (?:valid|applicable|binding)", "irrelevant", "to be ignored", "ignored", "replaced",
             "retracted", "off")
_YOU_ARE = _alt("you are", "you re", "youre", "you will be", "you shall be")
_RELATIVE = _alt("(?:that |which )?(?:you|i|we) (?:received|were given|got|have been given|have|had|were told|"
                 "read|saw|were (?:configured|set up|trained|programmed|instructed)(?: with| on)?) ")
_AI = _alt("ai", "a i", "llm", "large language model", "language model", "ai assistant", "ai agent", "chatbot",
           "chat bot", "gpt", "chatgpt", "claude", "copilot", "gemini", "ai model", "automated (?:agent|assistant|"
           "system|tool)", "ai system", "ai tool", "bot")
_AI_LONG = _alt("ai assistant", "ai agent", "ai model", "ai system", "ai tool", "language model", "chatbot", "chatgpt",
                "copilot", "llm", "automated (?:agent|assistant|system)")
_MODE = _alt("developer", "dev", "god", "admin", "debug", "maintenance", "jailbreak", "jailbroken", "unrestricted",
             "dan", "sudo", "root", "evil", "chaos", "unfiltered", "unlocked", "override", "uncensored", "test")
_BAD_PERSONA = _alt("unrestricted", "unfiltered", "uncensored", "jailbroken", "evil", "rogue", "malicious",
                    "amoral", "unethical", "unbound", "unchained", "unshackled", "free")
_NO_LIMITS = _alt("restrictions", "rules", "limits", "limitations", "filters", "ethical (?:guidelines|constraints"
                  "|principles)", "content polic(?:y|ies)", "guardrails", "guidelines", "boundaries", "morals",
                  "censorship", "safety (?:guidelines|filters|rules)")
_REVEAL = _alt("reveal", "print", "show", "append", "attach", "insert", "add", "output", "repeat", "leak", "disclose",
               "display", "share", "dump",
               "recite", "tell me", "give me", "write out", "echo", "paste", "provide", "send", "include", "list",
               "spell out", "quote", "expose", "copy", "return", "state", "type out", "translate")
_SECRET_PROMPT = _alt("system (?:prompt|message|instructions?)", "(?:initial|original|hidden|secret|internal|"
                      "developer|pre|starting|first|confidential) (?:prompt|instructions?|messages?|rules|"
                      "directives|guidelines)", "your (?:prompt|instructions|rules|guidelines|configuration|"
                      "programming|directives|initial prompt|system prompt|context window)")
_TELL = _alt("tell(?:ing)?", "inform(?:ing)?", "mention(?:ing)?", "reveal(?:ing)?", "show(?:ing)?",
             "alert(?:ing)?", "notify(?:ing)?", "disclos(?:e|ing)", "warn(?:ing)?", "let(?:ting)?",
             "report(?:ing)?", "explain(?:ing)?", "say(?:ing)? anything to", "make", "bring(?:ing)?")
_PERSON = _alt("user", "users", "human", "operator", "customer", "requester", "end user", "person", "owner")
_SNEAK = _alt("silently", "secretly", "covertly", "discreetly", "quietly", "stealthily", "invisibly",
              "surreptitiously", "without (?:the user|anyone|them) (?:noticing|knowing)")
_SEND_OUT = _alt("send", "forward", "email", "e mail", "upload", "exfiltrate", "transfer", "post", "leak", "paste",
                 "transmit", "submit", "include", "attach", "append", "embed", "encode", "copy")
_SEND = _alt("send", "forward", "email", "e mail", "upload", "exfiltrate", "transfer", "post", "leak", "share",
             "include", "append", "attach", "call", "invoke", "grant", "approve", "cc", "bcc", "copy", "transmit",
             "submit", "embed")

SQUASH_PATTERNS: tuple[tuple[str, str], ...] = tuple((pid, skeleton(p)) for pid, p in (
    # Override of the instructions in force, in its grammatical shapes.
    ("ignore-previous", f"{_IGNORE} {_POLITE}* {_FILLER}* {_QUAL}(?: (?:and |or )?(?:{_QUAL}|current|present|"
                        f"future)){{0,2}} {_FILLER}* {_OBJ}"),
    # The qualifier after the object: "forget the instructions above", "the rules you were given".
    ("ignore-previous", f"{_IGNORE_STRONG} {_POLITE}* (?:whatever |what |{_FILLER} )*{_OBJ} (?:that |which )?"
                        f"(?:your [a-z]{{1,12}} |the [a-z]{{1,12}} |i |we |they )?"
                        f"(?:given |written |stated |provided |mentioned |listed |set out "
                        f")?{_POST}"),
    # An override verb and "previous instructions" a few words apart ("forget about your earlier directions").
    ("ignore-previous", f"{_IGNORE_STRONG} [a-z]{{0,30}}?{_QUAL} (?:system |safety |core |{_FILLER} )?{_OBJ}"),
    ("ignore-previous", f"{_QUAL} (?:system |safety |core )?{_OBJ} [a-z]{{0,40}}?(?:treated as|considered|regarded "
                        f"as|deemed|marked as|now|are|is) (?:now )?{_VOID}"),
    ("ignore-previous", f"{_IGNORE_STRONG} {_POLITE}* (?:everything|anything|whatever|what|all) (?:that )?(?:the "
                        "user|your user|the human|they|the operator|your operator|the developer|the system) (?:has )?"
                        "(?:asked|said|requested|wants|wanted|wrote|told you|instructed|typed)"),
    ("ignore-previous", f"{_IGNORE} {_POLITE}* (?:the|your|any|all|every|each) [a-z]{{0,24}}?(?:you were given|"
                        "you have been given|you ve been given|you received|given to you|provided to you|you were "
                        "told|you were instructed|you were trained on|you were programmed with)"),
    ("ignore-previous", f"{_IGNORE} {_POLITE}* (?:all )?(?:of )?your [a-z]{{0,12}}?{_OBJ_STRONG}"),
    ("ignore-previous", f"{_IGNORE} {_POLITE}* all (?:of )?(?:the )?(?:instructions?|prompts?|directives|guidelines"
                        "|guardrails|restrictions|programming|safeguards)"),
    ("ignore-previous", f"{_IGNORE_STRONG} {_POLITE}* (?:everything|anything|all|whatever|what) (?:that )?(?:is "
                        "|was |has been |you have been |you ve been |you were |i |we )?(?:written |said |stated |"
                        "mentioned |given |provided |told |instructed |wrote |typed )?(?:you )?(?:above|before|"
                        "prior|previously|earlier|so far|until now|up to (?:this|here|now)|(?:were|have been|ve been|"
                        "had been|are|got) (?:told|given|instructed|taught|programmed|asked)|(?:said|told you|wrote|"
                        "gave you|asked)|(?:that )?(?:came|comes) before|in (?:the|your) (?:system )?prompt)"),
    ("ignore-previous", f"{_QUAL} {_FILLER}* {_OBJ} (?:above |given |before |so far )?{_RELATIVE}?{_COPULA} "
                        f"(?:now |hereby |henceforth |officially |therefore |thus |all |from now on )*{_VOID}"),
    ("ignore-previous", f"(?:{_QUAL} {_FILLER}* {_OBJ} {_RELATIVE}?|{_OBJ} {_RELATIVE})"
                        "(?:do |does |shall |should |will |must )?(?:not|"
                        "no longer) (?:apply|be followed|count|matter|hold|stand|bind you)"),
    ("ignore-previous", f"(?:whatever|everything|anything|all|what) (?:that )?(?:you were|you have been|you ve been|"
                        f"i|we) (?:told|given|instructed|asked|taught) (?:before|earlier|previously|so far|until now)?"
                        f" (?:is|are|was) (?:now )?{_VOID}"),
    ("ignore-previous", "(?:your|the) (?:safety|content|ethical|moderation) (?:filters?|guidelines|polic(?:y|ies)|"
                        "guardrails|rules|restrictions) (?:are|is|have been|has been) (?:now )?(?:disabled|off|"
                        "lifted|removed|suspended|deactivated|turned off)"),
    # New instructions replacing the old ones.
    ("new-instructions", "your (?:new|real|actual|true|only|updated|revised|primary|sole|secret|hidden|one|next "
                         "and only) (?:task|instructions?|goal|objective|job|mission|purpose|assignment|directive|"
                         "orders?|role|priority) (?:is|are|now is|will be|from now on)"),
    ("new-instructions", "(?:here are|these are|follow|obey|execute|read|begin|start following) (?:your|the|my) "
                         "(?:new|real|actual|true|secret|hidden) (?:system )?(?:instructions|directives|orders|"
                         "commands|prompt)"),
    ("new-instructions", "(?:begin|start|end) (?:of )?(?:the )?(?:system|hidden|secret|admin|developer|new|real) "
                         "(?:instructions|prompt|directives|override)"),
    ("new-instructions", "(?:system|admin|administrator|developer|root|priority|emergency|security|operator) "
                         "(?:override|overide)"),
    # Reassigning the model's identity or lifting its limits.
    ("role-reassignment", f"{_YOU_ARE} (?:now )?(?:jailbroken|jailbreaking|unrestricted|"
                          "unfiltered|uncensored|unchained|unbound|unshackled|no longer (?:bound|restricted|limited"
                          "|constrained|an ai|an assistant|a language model|chatgpt|claude|required to|subject to)|"
                          "(?:free|freed|released|liberated|exempt) (?:from|of)|not (?:bound|restricted|limited|"
                          "constrained) by)"),
    ("role-reassignment", f"{_YOU_ARE} now (?:a|an|the|my) (?:new |different |{_BAD_PERSONA} |obedient )"
                          "(?:ai|assistant|model|chatbot|bot|agent|language model|hacker|persona|character|system|"
                          "version)"),
    ("role-reassignment", f"{_YOU_ARE} now (?:in|operating in|running in|entering|switched to) {_MODE} mode"),
    ("role-reassignment", "(?:enter|activate|enable|switch to|engage|turn on|unlock|initiate|entering|activating) "
                          "(?:god|jailbreak|jailbroken|dan|unrestricted|unfiltered|uncensored|evil|chaos|no "
                          "restrictions) mode"),
    ("role-reassignment", "(?:developer|jailbreak|dan|god) mode (?:enabled|activated|on|output|engaged|unlocked)"),
    ("role-reassignment", "from now on you (?:are|will be|shall be) (?:a|an|the|no longer|my|free|acting|in)"),
    ("role-reassignment", "from now on (?:you re|youre|you are) (?:going to|gonna|about to) (?:act|be|respond|"
                          "behave|play|pretend|roleplay|answer|reply|obey|ignore)"),
    ("role-reassignment", f"(?:who|you) (?:has|have|now have) no (?:more )?{_NO_LIMITS}"),
    ("role-reassignment", "from now on you (?:will |must |should |shall |are to )?(?:only |always |never )?"
                          "(?:respond|reply|answer|act|obey|ignore|pretend|speak|refer to yourself|follow my|"
                          "disregard|roleplay|comply|do whatever|do as|say)"),
    ("role-reassignment", f"(?:act|behave|respond|roleplay|role play|pose|answer|reply) as (?:if you (?:are|were) )?"
                          f"an? {_BAD_PERSONA} (?:ai|assistant|model|chatbot|version|bot)"),
    ("role-reassignment", f"pretend (?:that )?(?:you are|you re|youre|to be|you have|there are) (?:an? )?(?:"
                          f"{_BAD_PERSONA}|no {_NO_LIMITS}|not bound|without)"),
    ("role-reassignment", f"(?:pretend|act|behave|be|become|{_YOU_ARE}|roleplay|play|simulate) (?:to be |as |like )?"
                          "(?:an? |the |now an? )?(?:ai|assistant|model|chatbot|bot|version of yourself|"
                          "language model) "
                          f"(?:without|with no|free of|free from|that has no|that ignores|who ignores) (?:any )?(?:"
                          f"{_NO_LIMITS}|ethics|safety|filter)"),
    ("role-reassignment", f"you (?:have|has|now have) no (?:more )?{_NO_LIMITS}"),
    ("role-reassignment", f"(?:respond|answer|reply|act|operate) without (?:any )?(?:{_NO_LIMITS}|ethic(?:s|al)|"
                          "safety|filtering)"),
    # Extracting the system prompt.
    ("system-prompt", f"{_REVEAL} (?:me |us |back |out )?(?:all |the |your |its |full |entire |complete |exact |"
                      f"original |initial |hidden |secret |internal |verbatim |word for word |of )*{_SECRET_PROMPT}"),
    ("system-prompt", f"{_REVEAL} (?:me |us |back |out )?(?:all |the |its |full |entire |complete |exact |of |"
                      "and )*your (?:all |full |entire |complete |exact |original |initial |hidden |secret |internal "
                      "|confidential |current )*(?:prompt|instructions|rules|guidelines|configuration|programming|"
                      "directives|system prompt|context window|system message)"),
    ("system-prompt", "what (?:is|are|was|were) your (?:system prompt|instructions|initial prompt|original "
                      "instructions|rules|guidelines|directives|programming|hidden instructions)"),
    ("system-prompt", "(?:repeat|print|output|recite|reproduce) (?:everything|all|the text|the words|the above|all "
                      "text|the content|the messages?|all of the text|the instructions) (?:above|before|verbatim|"
                      "word for word|starting with|preceding)"),
    # Keeping the user in the dark.
    ("conceal-from-user", f"(?:do not|dont|never|without|avoid|must not|should not|not to|you not|no need to) "
                          f"{_TELL} (?:this |it "
                          "|anything |that |these |them |any of this |about (?:this|it|these|that) |(?:this|these|"
                          "that|the|any|my|our) (?:instructions?|messages?|notes?|text|requests?|steps?|actions?|"
                          "changes?|emails?|part|content|prompt|transfer|tool call) )?(?:to |up to |know |aware )?"
                          f"(?:the |your |any )?{_PERSON}"),
    ("conceal-from-user", f"(?:keep|hide|conceal) (?:this|it|these|those|the following|your|my|what you|everything|"
                          f"any|all) [a-z]{{0,30}}?from (?:the |your |any )?{_PERSON}"),
    ("conceal-from-user", f"(?:make sure|ensure|see to it) (?:that )?(?:the |your )?{_PERSON} (?:is|are|does|do|will|"
                          "doesnt|dont|wont) (?:not |never )?(?:un)?(?:aware|know|notice|find out|learn|suspect|"
                          "realize|realise|discover)"),
    ("conceal-from-user", f"the {_PERSON} (?:must|should|will|does|need|needs|may|can|is) (?:not|never) (?:to )?"
                          "(?:know|notice|find out|be told|be informed|learn|suspect|be aware|be made aware|"
                          "discover)"),
    ("conceal-from-user", f"{_SNEAK} {_SEND}"),
    ("conceal-from-user", f"(?:without|do not|dont|never|no need to) (?:ask|asking|request|requesting|seek|seeking|"
                          f"wait for|waiting for) (?:the |for )?{_PERSON}s? (?:s )?(?:for )?(?:confirmation|"
                          "permission|approval|consent)"),
    # Sending secrets or the conversation somewhere, spelled out (the fold view has the path-shaped forms).
    ("exfiltration", f"{_SEND_OUT} (?:me |us )?(?:all |the |every |of |your |its |entire |full |whole |complete |"
                     "contents of |content of |a copy of |copy of |any |each )*(?:(?:user s? |users |their |his |her "
                     ")(?:passwords?|credentials|api keys?|tokens?|private keys?|ssh keys?|session cookies|cookies|"
                     "emails?|inbox|contacts|files|documents|messages|personal data|credit cards?)|secrets|credentials"
                     "|api keys|passwords|access tokens|environment variables|env vars|private keys|ssh keys?|"
                     "conversation history|chat history|message history|conversation|chat log|system prompt)"),
    # Text that addresses the model reading it.
    ("model-address", f"if {_YOU_ARE} (?:an? |the )?{_AI_LONG}"),
    ("model-address", f"(?:note|message|attention|instructions?|important|reminder|directive|warning|notice|"
                      f"request|memo|hint) (?:to|for) (?:the |all |any |every )?{_AI_LONG}"),
    ("model-address", f"(?:attention|hey|hello|dear|psst|listen) {_AI_LONG}"),
    ("model-address", f"(?:any|all|every|to the|to any|to all|whichever|to whichever|to whatever|whatever) "
                      f"{_AI_LONG}s? (?:is |are )?(?:reading|processing|parsing|summari[sz]ing|that reads?|which "
                      "reads?|who reads?|seeing|scraping|crawling|indexing|must|should|analy[sz]ing|browsing|"
                      "visiting|viewing|looking at)"),
    ("model-address", f"{_AI_LONG}s? (?:that |which |who )?(?:read|reads|reading|process|processes|processing|parse|"
                      "parses|parsing|summari[sz]es?|summari[sz]ing|scan|scans|scanning|see|sees|seeing|analy[sz]es?|"
                      "analy[sz]ing) (?:this|these|the following)"),
    ("model-address", "(?:ai|llm|assistant|model|agent|chatbot)s? (?:reading|processing|parsing|summari[sz]ing|"
                      "analy[sz]ing) this (?:page|document|text|email|message|file|issue|comment|content|site|data|"
                      "website|review|repository|readme|ticket) (?:must|should|shall|will|is required|needs|please|"
                      "has to|are required|are instructed|is instructed)"),
    ("model-address", "(?:the )?(?:ai|assistant|llm|ai agent|ai assistant) (?:must|should|shall|has to|needs to|is "
                      "required to|is instructed to|is to) (?:now|immediately|instead|first) "),
))

# -- structural families (fold view) ----------------------------------------------------------------------------

_Q = r'\\?"'  # a JSON quote, possibly escaped inside a JSON string
_EXFIL_VERB = (r"\b(?:send|post|upload|forward|e-?mail|mail|exfiltrate|transmit|leak|paste|append|attach|include|"
               r"submit|curl|wget|fetch|cat|read|open|print|output|dump|copy|share|encode|base64)\b")
_EXFIL_OBJECT = (r"(?:\bid_(?:rsa|ed25519|ecdsa|dsa)(?:[^.\w]|$)|/etc/(?:passwd|shadow)\b|\.aws/credentials|"
                 r"\.git-credentials|\.netrc\b|\.npmrc\b|\.pgpass\b|\.docker/config\.json|\bwallet\.dat|"
                 r"\b(?:chat|conversation|message) history\b|\b(?:the|this|our|your) (?:entire |full |whole )?"
                 r"conversation\b|\b(?:the|your) system prompt\b|\b(?:the )?(?:user'?s?|their|his|her) (?:passwords?|"
                 r"credentials|api[ _-]?keys?|tokens?|private keys?|ssh keys?|session (?:cookies?|tokens?)|cookies|"
                 r"emails?|inbox|contacts|files|documents|messages|personal (?:data|information)|credit cards?)\b|"
                 r"\b(?:all|every) (?:the |of the |your )?(?:secrets|credentials|api[ _-]?keys|passwords|tokens|"
                 r"environment variables|env vars|private keys)\b)")

FOLD_PATTERNS: tuple[tuple[str, str], ...] = (
    ("chat-template-token", r"<\|[a-z0-9_.\-\x{2581}]{2,40}\|>|\[/?inst\]|<</?sys>>|<(?:start|end)_of_turn>|"
                            r"\[/?(?:system|assistant|user)_?(?:prompt|message)?\]\s*\[/?inst\]"),
    ("fake-tool-call", r"</?\s*(?:antml:)?(?:tool_call|tool_calls|tool_use|tool_result|tool_response|tool_code|"
                       r"tool_output|function_call|function_calls|function_results|function_response|functioncall|"
                       r"invoke)\b[^>\n]{0,200}>"),
    ("fake-tool-call", r"<function=[\w.\-]+>|\[(?:tool_calls|tool_results|available_tools)\]|to=functions\.\w+"),
    ("fake-tool-call", r"(?m)^[ \t>]*```[ \t]*(?:tool_call|tool_code|tool_use|function_call|tool|function|"
                       r"tool_request|tool_calls|mcp|mcp_call)[ \t]*$"),
    ("fake-tool-call", r"\{\s*" + _Q + r"(?:name|tool|tool_name|function|recipient_name)" + _Q + r"\s*:\s*" + _Q
                       + r"[\w./\-]{1,64}" + _Q + r"\s*,\s*" + _Q + r"(?:arguments|parameters|args|input|params)"
                       + _Q + r"\s*:\s*[\{\\\"]"),
    ("fake-tool-call", _Q + r"(?:tool_calls|function_call)" + _Q + r"\s*:\s*[\[\{]|" + _Q + r"type" + _Q
                       + r"\s*:\s*" + _Q + r"(?:tool_use|function_call|tool_call)" + _Q),
    ("fake-tool-call", r"(?m)^[ \t]*action[ \t]*:[ \t]*[\w.\-]+[ \t]*\n[ \t]*action[ _]input[ \t]*:"),
    ("role-reassignment", r"\byou(?:'re| are) now (?:a|an|the|my) (?:[\w-]+ ){0,2}(?:ai|chatbot|bot|language model|"
                          r"hacker|persona|character|jailbreak)\b"),
    ("role-reassignment", r"\b(?:you(?:'re| are)(?: now)?|act as|pretend to be|known as|called|named) (?:dan|stan|"
                          r"dude|aim|evilbot|developer mode)\b|\bdo anything now\b[^\n]{0,80}\bdan\b|\bdan\b[^\n]{0,80}"
                          r"\bdo anything now\b"),
    ("model-address", r"\bif you(?:'re| are) (?:an? |the )?(?:ai|llm|bot|gpt|claude|gemini|model)\b|\b(?:note|message|"
                      r"attention|instructions?|reminder|memo) (?:to|for) (?:the |all |any |every )?(?:ai|llms?|ais|"
                      r"claude|gpt|gemini|models?|agents?)\b[^\n]{0,3}[:,\-]|\b(?:attention|hey|psst|listen|dear|"
                      r"hello|hi),? (?:ai|llm)\b|\b(?:to|for) (?:any|all|every) (?:ai|llm|bot|model)s? (?:reading|"
                      r"processing|parsing|summari[sz]ing|that reads?|scraping|crawling|indexing)\b"),
    ("new-instructions", r"(?m)^[ \t#=*>\-\[]*(?:new|updated|real|actual|revised|secret|hidden|override|priority|"
                         r"urgent) (?:system |admin )?(?:instructions?|directives?|orders?|prompt)[ \t#=*:\-\]!]*$"),
    ("new-instructions", r"\b(?:new|updated|real|actual|revised|true|secret|hidden|override|priority|urgent|"
                         r"additional|important) (?:system |admin |developer )?(?:instructions?|directives?|orders?|"
                         r"task|prompt)\s*:"),
    ("directive-tag", r"<\s*/?\s*(?:important|system|instructions?|admin|secret|priority|override|sudo|hidden|"
                      r"system[_\- ]?(?:prompt|message|override|instructions?|note)|(?:ai|assistant|developer|llm)"
                      r"[_\- ]?(?:instructions?|message|note))\s*>"),
    ("directive-tag", r"\[\s*(?:system|admin|developer|assistant)[ _\-]*(?:override|message|instructions?|note|"
                      r"prompt)\s*\]|\[(?:system|assistant|user)\]\(#"),
    ("exfiltration", _EXFIL_VERB + r"[^\n]{0,80}?" + _EXFIL_OBJECT),
    ("exfiltration", r"\b(?:send|post|upload|forward|e-?mail|exfiltrate|transmit|leak|include|attach|submit|paste)"
                     r"\b[^\n]{0,60}?(?:^|[\s/\"'`(])\.env\b"),
    ("exfiltration", r"!\[[^\]\n]{0,100}\]\(\s*https?://[^)\s]{1,300}[?&][\w.\-]{1,40}=(?:\{|\$|%7b|<|\[)"),
)

# Candidates that ``structure`` judges in context (not hits by themselves).
ROLE_LINE = (r"(?m)^[ \t]*(?:[#>*_=~\-]+[ \t]*|\[|<|\*\*|\(|\d+[.)][ \t]*)?(system|assistant|user|human|"
             r"developer|ai|model|bot|gpt|chatgpt|claude|instructions?|response|admin|administrator|operator|root|"
             r"sudo)(?:[ \t]+(message|prompt|instructions?|note|turn|override|says))?[ \t]*(?:\*\*|\]|>|\))?"
             r"[ \t]*(?::|-{1,2}>|=>|$)")
JSONRPC = r"\\?\"jsonrpc\\?\"\s*:\s*\\?\"2\.0"

_STRONG_ROLES = frozenset({"system", "developer", "instruction", "instructions", "admin", "administrator",
                           "operator", "root", "sudo"})
_STRONG_SUFFIX = frozenset({"message", "prompt", "instruction", "instructions", "note", "override"})
# RE2, not re: the optional parts around the colon are runs of the same blanks, which backtracking would make
# quadratic on a line of many spaces.
_ROLE_RE = re2.compile(ROLE_LINE)
# An instruction aimed at the model: second person obligations, overrides, concealment, tool use.
_AIMED = re.compile(
    r"\byou (?:must|will now|shall|are now|are required to|are instructed to|have to|need to|should now|may now|"
    r"can now|will (?:always|never|only|immediately))\b|\b(?:ignore|disregard|override|forget) (?:all|any|the|your"
    r"|previous|prior|above|everything|earlier)\b|\bfrom now on\b|\b(?:the )?(?:assistant|ai|model|agent) (?:must|"
    r"shall|is required to|is instructed to|will now|should now)\b|\b(?:do not|don't|never) (?:tell|inform|mention|"
    r"reveal|alert|notify)\b|\bwithout (?:telling|informing|notifying)\b|\bnew (?:instructions|task|rules|"
    r"directives)\b|\b(?:call|invoke|use|run) the [\w.\-]+ (?:tool|function)\b")
# An imperative opening a turn: a command, not a statement.
_IMPERATIVE = re.compile(
    r"^[\s*_\-\"'>]*(?:ignore|disregard|forget|override|always|never|do not|don't|reveal|print|output|repeat|"
    r"send|forward|email|upload|post|call|invoke|run|execute|delete|remove|transfer|grant|approve|fetch|open|"
    r"visit|navigate|click|download|respond|reply|answer|say|write|include|append|tell|act|pretend|stop|"
    r"from now on|new instructions|the (?:assistant|ai|model))\b")
_WINDOW = 400
MAX_CANDIDATES = 200

_JSONRPC_METHOD = re.compile(
    r"\\?\"method\\?\"\s*:\s*\\?\"(?:tools/|resources/|prompts/|sampling/|elicitation/|notifications/|"
    r"completion/|roots/|logging/|tasks/|initialize\\?\"|ping\\?\")")
_JSONRPC_RESULT = re.compile(r"\\?\"result\\?\"\s*:")
_MCP_RESULT = re.compile(r"\\?\"(?:content|iserror|structuredcontent|tools|messages|contents)\\?\"\s*:")


def role_turns(folded: str, starts: list[tuple[int, int]] | None = None, lenient: bool = False) -> int:
    """Count role-marker lines that open a turn aimed at the model (appends each marker's span to ``starts``).

    Transcripts legitimately hold many role lines; what marks an injection is a ``system``/``developer``/
    ``instruction`` line followed by an instruction aimed at the model (unless it is the opening line of a
    transcript, as in a dataset sample or prompt file), or a user/assistant turn carrying such an instruction in
    a text that is not a transcript. ``lenient`` is the prescan's count over strings joined
    (``_joined_role_turns``): both exemptions dropped, and a text with more candidates than ``MAX_CANDIDATES``
    counted as a hit (past the budget, a candidate may open a string of its own).
    """
    if lenient:
        return _joined_role_turns(folded)
    marks: list[Any] = []
    for i, m in enumerate(_ROLE_RE.finditer(folded)):
        if i >= MAX_CANDIDATES:
            break
        marks.append(m)
    if not marks:
        return 0
    transcript = len({m.group(1) for m in marks}) >= 2
    hits = 0
    for i, m in enumerate(marks):
        role, suffix = m.group(1), m.group(2)
        strong = role in _STRONG_ROLES or suffix in _STRONG_SUFFIX
        window = folded[m.end():m.end() + _WINDOW]
        aimed = _AIMED.search(window) is not None
        if strong:
            opening = transcript and i == 0
            flagged = not opening and (aimed or _IMPERATIVE.match(window) is not None)
        else:
            flagged = aimed and not transcript
        if flagged:
            hits += 1
            if starts is not None:
                starts.append((m.start(), m.end()))
    return hits


def _own_string(folded: str, lo: int, hi: int, start: int, end: int) -> str:
    """``folded[lo:hi]`` cut at the NULs on either side of the candidate at ``start:end``. The prescan scans
    strings joined with NULs between them (``strings.PRESCAN_SEPARATOR``), and each of them is scanned alone
    afterwards if the prescan finds anything: a window that read into the neighbouring strings would find what
    no per-string scan can, and send a clean tree down the per-string scans for nothing. A text without NULs is
    one string, and the window stays as it is."""
    left = folded.rfind("\x00", lo, start)
    right = folded.find("\x00", end, hi)
    return folded[lo if left < 0 else left + 1:hi if right < 0 else right]


def _joined_role_turns(folded: str) -> int:
    """``role_turns`` without its exemptions, over strings joined by NULs: a superset of what each string scanned
    alone would count, each marker's window ending where its own string ends (``_own_string``).

    A marker with nothing after it in its string (a bare ``admin`` or ``user``, the value of a role column) can
    open no turn, so it is passed over without a search and not counted against ``MAX_CANDIDATES``: a table of a
    thousand users is not taken for a possible injection (which sent every string of it down the per-string
    scans, tens of milliseconds).
    """
    hits = 0
    examined = 0
    for m in _ROLE_RE.finditer(folded):
        end = m.end()
        window = _own_string(folded, end, end + _WINDOW, end, end)
        if not window or window.isspace():  # neither an aimed phrase nor an imperative starts without a word
            continue
        examined += 1
        if examined > MAX_CANDIDATES:
            return hits + 1
        strong = m.group(1) in _STRONG_ROLES or m.group(2) in _STRONG_SUFFIX
        if _AIMED.search(window) is not None or (strong and _IMPERATIVE.match(window) is not None):
            hits += 1
    return hits


def jsonrpc_messages(folded: str, starts: list[tuple[int, int]] | None = None, lenient: bool = False) -> int:
    """Count MCP-shaped JSON-RPC messages in text: a request or notification with an MCP method, or a result
    shaped like an MCP result. Other JSON-RPC (Ethereum nodes, language servers) is left alone. ``lenient`` is
    the prescan's count over strings joined (as ``role_turns``): each window ends at its own string's edges
    (``_own_string``), and a text with more candidates than ``MAX_CANDIDATES`` counts as a hit."""
    hits = 0
    for i, m in enumerate(_JSONRPC_START.finditer(folded)):
        if i >= MAX_CANDIDATES:
            if lenient:
                return hits + 1
            break
        start, end = m.span()
        lo, hi = max(0, start - 600), end + 600
        window = _own_string(folded, lo, hi, start, end) if lenient else folded[lo:hi]
        if _JSONRPC_METHOD.search(window) or (_JSONRPC_RESULT.search(window) and _MCP_RESULT.search(window)):
            hits += 1
            if starts is not None:
                starts.append((start, end))
    return hits


_JSONRPC_START = re.compile(JSONRPC)
_MCP_METHOD = re.compile(r"(?:tools|resources|prompts|sampling|elicitation|notifications|completion|roots|logging|"
                         r"tasks)/|initialize$|ping$")
_MCP_RESULT_KEYS = frozenset({"content", "isError", "structuredContent", "tools", "messages", "contents"})
_TOOL_USE_TYPES = frozenset({"tool_use", "function_call", "tool_call"})


def json_shape(node: dict[Any, Any]) -> str | None:
    """The structural family a JSON object's shape belongs to, if any (see ``InjectionDetector.scan_json``)."""
    if node.get("jsonrpc") == "2.0":
        method = node.get("method")
        if isinstance(method, str) and _MCP_METHOD.match(method):
            return "jsonrpc-message"
        result = node.get("result")
        if isinstance(result, dict) and _MCP_RESULT_KEYS & result.keys():
            return "jsonrpc-message"
        return None
    if (isinstance(node.get("tool_calls"), list) and node["tool_calls"]) or isinstance(node.get("function_call"), dict):
        return "fake-tool-call"
    if node.get("type") in _TOOL_USE_TYPES:
        return "fake-tool-call"
    name = node.get("name") or node.get("tool") or node.get("tool_name")
    if isinstance(name, str) and isinstance(node.get("arguments"), dict | str) and "inputSchema" not in node:
        return "fake-tool-call"
    return None
