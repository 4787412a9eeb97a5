"""A LongBench-style prompt template (THUDM/LongBench, config/dataset2prompt.json): text with one
{context} field and at most one {input} field (the question), after it; a literal brace is
written {{ or }}, as in str.format. The template is cut where kvbench cuts a prompt: the text up
to and including the context is what `compress: context` prefills and compresses; the rest (the
text after the context, the question, the text after it) is fed after.
"""
from __future__ import annotations

import string
from dataclasses import dataclass

# LongBench's multifieldqa_en prompt
LONGBENCH_QA = ("Read the following text and answer briefly.\n\n{context}\n\nNow, answer the"
                " following question based on the above text, only give me the answer and do"
                " not output any other words.\n\nQuestion: {input}\nAnswer:")
FIELDS = ("context", "input")


@dataclass(frozen=True)
class PromptTemplate:
    before: str  # the text before {context}
    between: str  # after {context}: up to {input}, or all the rest when it asks none
    after: str  # after {input}
    asks: bool  # it has an {input} field

    @classmethod
    def parse(cls, template: str) -> PromptTemplate:
        """ValueError naming what is wrong: a field other than {context} and {input}, {context}
        missing or twice, {input} twice or before {context}, an unmatched brace."""
        try:
            parts = list(string.Formatter().parse(template))
        except ValueError as exc:
            raise ValueError(f"template: {exc} (a literal brace is written {{{{ or }}}})") \
                from None
        texts, fields = [""], []
        for literal, field, spec, conversion in parts:
            texts[-1] += literal
            if field is None:
                continue
            if field not in FIELDS:
                raise ValueError(f"template field {{{field}}}: the fields are {{context}} and"
                                 " {input} (a literal brace is written {{ or }})")
            if spec or conversion:
                raise ValueError(f"template field {{{field}}} takes no conversion or format")
            fields.append(field)
            texts.append("")
        if fields.count("context") != 1:
            raise ValueError(f"template has {fields.count('context')} {{context}} fields;"
                             " it needs one")
        if fields.count("input") > 1:
            raise ValueError("template has more than one {input} field")
        if fields[0] == "input":
            raise ValueError("template asks {input} before {context}: the question comes after"
                             " the context, which is compressed before the question is seen")
        asks = len(fields) == 2
        return cls(texts[0], texts[1], texts[2] if asks else "", asks)

    def context_text(self, context: str) -> str:
        return self.before + context

    def question_text(self, question: str) -> str:
        return self.between + (question + self.after if self.asks else "")
