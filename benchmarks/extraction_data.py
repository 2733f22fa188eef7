"""A labelled extraction set, generated deterministically, and its scorer (issue 27).

Five domains (`DOMAINS`): invoices, shipping addresses, calendar events, contacts and product reviews,
each with a JSON Schema (formats, enums, numbers, booleans), a user instruction, and a generator that
writes a document the way people write one (dates in words, amounts with currency signs and thousands
separators, names with titles, addresses across lines, distractor figures) together with its ground
truth. Example `i` of a domain depends only on (seed, domain, i), so a sample of N is the first N of
the full set, whatever else changes.

    examples(per_domain=60, seed=0) -> list[Example]      # 300 documents: the full set
    score(domain, predicted, truth) -> {field path: bool}  # after the normalisation in `normalise`

    python -m benchmarks.extraction_data --per-domain 2    # print a few documents and their truth
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

FULL_PER_DOMAIN = 60  # 5 domains: 300 documents

FIRST = (
    "Maria Jonas Adaeze Wei Priya Lukas Sofia Mateo Yuki Olivia Ahmed Chloé Henrik Fatima Tomasz Aoife "
    "Rafael Ingrid Kwame Elena James Sarah Hiroshi Ana"
).split()
LAST = (
    "Schmidt Okonkwo Zhang Raman Becker Rossi García Tanaka Johnson Haddad Dubois Lindqvist Mensah Nowak "
    "Murphy Costa Petrov O'Brien Müller Kowalski Fischer Nguyen"
).split()
TITLES = ["Mr.", "Mrs.", "Ms.", "Dr.", "Prof.", "Mr", "Ms", "Dr"]
COMPANIES = [
    "Nordlicht Möbel GmbH",
    "Brightwave Solutions Ltd",
    "Acme Logistics Inc.",
    "Sakura Trading Co., Ltd.",
    "Blue Harbor Coffee Roasters",
    "Helvetia Präzision AG",
    "Maple & Finch LLC",
    "Studio Verde S.r.l.",
    "Oakridge Dental Group",
    "Pixelforge Games",
    "Kestrel Aerospace Components",
    "Lindqvist & Partners AB",
]
MONTHS = "January February March April May June July August September October November December".split()
WEEKDAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()


@dataclass(frozen=True)
class Example:
    """One document: `document` (the text), `truth` (the JSON value a perfect extraction gives)."""

    domain: str
    id: str
    document: str
    truth: dict


@dataclass(frozen=True)
class Domain:
    """name; schema (JSON Schema of the answer); instruction (the user's request, before the
    document); names (top-level fields holding person names: titles are dropped when scoring);
    phones (fields holding phone numbers: compared by digits); make(rng) -> (document, truth)."""

    name: str
    schema: dict
    instruction: str
    make: Callable[[random.Random], tuple[str, dict]]
    names: tuple[str, ...] = ()
    phones: tuple[str, ...] = ()


# -- how people write values ---------------------------------------------------------------------------


def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def written_date(rng: random.Random, d: dt.date) -> str:
    """A date in one of the ways people write one in English prose (never a bare ambiguous 03/04)."""
    m, wd = MONTHS[d.month - 1], WEEKDAYS[d.weekday()]
    return rng.choice(
        [
            f"{d.day} {m} {d.year}",
            f"{m} {d.day}, {d.year}",
            f"{m} {ordinal(d.day)}, {d.year}",
            f"the {ordinal(d.day)} of {m} {d.year}",
            f"{wd}, {d.day} {m} {d.year}",
            f"{wd}, {m} {ordinal(d.day)} {d.year}",
            f"{m[:3]} {d.day}, {d.year}",
            f"{d.day}-{m[:3]}-{d.year}",
        ]
    )


def random_date(rng: random.Random) -> dt.date:
    return dt.date(2023, 1, 1) + dt.timedelta(days=rng.randrange(5 * 365))


def grouped(value: float, decimals: int, sep: str = ",", point: str = ".") -> str:
    """`value` with thousands separators: grouped(1249.5, 2) == "1,249.50"."""
    text = f"{value:,.{decimals}f}"
    return text.replace(",", "\0").replace(".", point).replace("\0", sep)


def written_amount(amount: float, currency: str, style: int) -> str:
    """An amount with its currency written as people write it: "$12,480.50", "1.249,00 €", "CHF 3'450.50";
    `style` (any int) picks the form, so one document writes all its amounts alike."""
    if currency == "JPY":
        forms = [f"¥{grouped(amount, 0)}", f"JPY {grouped(amount, 0)}", f"{grouped(amount, 0)} yen"]
        return forms[style % len(forms)]
    us = grouped(amount, 2)
    forms = {
        "USD": [f"${us}", f"USD {us}", f"US${us}", f"{us} USD"],
        "EUR": [f"€{us}", f"{grouped(amount, 2, '.', ',')} €", f"EUR {us}", f"€ {grouped(amount, 2, '.', ',')}"],
        "GBP": [f"£{us}", f"GBP {us}", f"£{us} (GBP)"],
        "CHF": [f"CHF {grouped(amount, 2, chr(39))}", f"CHF {us}", f"{grouped(amount, 2, chr(39))} CHF"],
    }[currency]
    return forms[style % len(forms)]


def person(rng: random.Random) -> tuple[str, str]:
    """(name as the truth has it, name as written: with a title half the time)."""
    name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    return name, (f"{rng.choice(TITLES)} {name}" if rng.random() < 0.5 else name)


# -- invoices ------------------------------------------------------------------------------------------

CURRENCIES = ["EUR", "USD", "GBP", "CHF", "JPY"]
INVOICE_SCHEMA = {
    "type": "object",
    "properties": {
        "vendor": {"type": "string", "description": "the company that issued the invoice"},
        "invoice_number": {"type": "string"},
        "invoice_date": {"type": "string", "format": "date"},
        "due_date": {"type": "string", "format": "date", "description": "when payment is due"},
        "customer_name": {"type": "string", "description": "the person billed"},
        "currency": {"enum": CURRENCIES},
        "total": {"type": "number", "description": "the total due, tax included"},
    },
    "required": ["vendor", "invoice_number", "invoice_date", "due_date", "customer_name", "currency", "total"],
}


def make_invoice(rng: random.Random) -> tuple[str, dict]:
    vendor = rng.choice(COMPANIES)
    number = rng.choice(
        [
            f"INV-{rng.randint(2023, 2027)}-{rng.randint(1, 9999):04d}",
            f"#{rng.randint(10000, 99999)}",
            f"RE-{rng.randint(100000, 999999)}",
            f"A-{rng.randint(1000, 99999)}",
        ]
    )
    issued = random_date(rng)
    due = issued + dt.timedelta(days=rng.choice([7, 14, 30, 60]))
    name, written_name = person(rng)
    currency = rng.choice(CURRENCIES)
    rate = rng.choice([0.0, 0.07, 0.19, 0.2, 0.077, 0.1])
    if currency == "JPY":
        subtotal = float(rng.randint(5, 3000) * 1000)
        tax = float(round(subtotal * rate))
    else:
        subtotal = round(rng.uniform(40, 25000), 2)
        tax = round(subtotal * rate, 2)
    total = round(subtotal + tax, 2)
    style = rng.randrange(12)
    amount = lambda a: written_amount(a, currency, style)  # noqa: E731
    issued_w, due_w = written_date(rng, issued), written_date(rng, due)
    tax_line = f"VAT ({rate * 100:g}%): {amount(tax)}\n" if rate else ""
    document = rng.choice(
        [
            f"From: billing@{re.sub(r'[^a-z]', '', vendor.lower())[:12]}.com\nSubject: Invoice {number}\n\n"
            f"Dear {written_name},\n\nplease find your invoice {number}, issued on {issued_w}.\n"
            f"Subtotal: {amount(subtotal)}\n{tax_line}Total due: {amount(total)}\n"
            f"Please pay by {due_w}.\n\nKind regards,\n{vendor}",
            f"{vendor.upper()}\nINVOICE\n\nInvoice no.: {number}\nDate: {issued_w}\nBill to: {written_name}\n\n"
            f"Net amount ........ {amount(subtotal)}\n{tax_line}AMOUNT DUE ........ {amount(total)}\n"
            f"Due date: {due_w}",
            f"Hi {written_name},\n\n"
            f"a quick reminder from {vendor}: invoice {number} dated {issued_w} for {amount(total)} "
            f"(that is {amount(subtotal)} plus tax) is due on {due_w}.\n\nThanks!",
        ]
    )
    truth = {
        "vendor": vendor,
        "invoice_number": number,
        "invoice_date": issued.isoformat(),
        "due_date": due.isoformat(),
        "customer_name": name,
        "currency": currency,
        "total": total,
    }
    return document, truth


# -- shipping addresses ---------------------------------------------------------------------------------

# country code -> (names people write, [(street, postal code, city, how the lines are laid out there)])
EU, NA, UK = (
    "{street}\n{postal} {city}\n{country}",
    "{street}\n{city}, {region} {postal}\n{country}",
    "{street}\n{city}\n{postal}\n{country}",
)
ADDRESSES = {
    "DE": (
        ["Germany", "Deutschland", "DE"],
        [("Kastanienallee 37", "10435", "Berlin", EU), ("Hafenstraße 12", "20457", "Hamburg", EU)],
    ),
    "US": (
        ["USA", "United States", "U.S.A."],
        [("1234 Maple Avenue", "62704", "Springfield", NA), ("88 Harbor Road", "02110", "Boston", NA)],
    ),
    "GB": (
        ["United Kingdom", "UK", "England"],
        [("221B Baker Street", "NW1 6XE", "London", UK), ("14 Castle Street", "EH2 3AH", "Edinburgh", UK)],
    ),
    "FR": (["France"], [("12 Rue des Lilas", "75003", "Paris", EU), ("5 Quai Saint-Antoine", "69002", "Lyon", EU)]),
    "NL": (["The Netherlands", "Netherlands", "Holland"], [("Keizersgracht 123", "1015 CJ", "Amsterdam", EU)]),
    "CA": (
        ["Canada"],
        [("350 Bay Street", "M5H 2S6", "Toronto", NA), ("1200 Rue Sherbrooke", "H3A 1H6", "Montreal", NA)],
    ),
    "AU": (["Australia"], [("42 Wallaby Way", "2000", "Sydney", "{street}\n{city} {region} {postal}\n{country}")]),
    "CH": (["Switzerland", "Schweiz"], [("Bahnhofstrasse 10", "8001", "Zürich", EU)]),
    "ES": (["Spain", "España"], [("Calle Mayor 8", "28013", "Madrid", EU)]),
}
REGION = {"Springfield": "IL", "Boston": "MA", "Toronto": "ON", "Montreal": "QC", "Sydney": "NSW"}
SHIPPING_SCHEMA = {
    "type": "object",
    "properties": {
        "order_number": {"type": "string"},
        "recipient": {"type": "string", "description": "the person the parcel is for"},
        "street": {"type": "string", "description": "street and house number"},
        "postal_code": {"type": "string"},
        "city": {"type": "string"},
        "country": {"enum": sorted(ADDRESSES), "description": "ISO 3166-1 alpha-2 country code"},
        "delivery": {"enum": ["standard", "express", "next_day"]},
    },
    "required": ["order_number", "recipient", "street", "postal_code", "city", "country", "delivery"],
}
DELIVERY = {
    "standard": ["Standard shipping (5-7 business days)", "standard delivery", "Economy / Standard"],
    "express": ["Express shipping (2-3 days)", "express", "Express Courier"],
    "next_day": ["Next-day delivery", "next day", "Overnight (next business day)"],
}


def make_shipping(rng: random.Random) -> tuple[str, dict]:
    code = rng.choice(sorted(ADDRESSES))
    names, places = ADDRESSES[code]
    street, postal, city, layout = rng.choice(places)
    name, written_name = person(rng)
    delivery = rng.choice(sorted(DELIVERY))
    order = rng.choice([f"{rng.randint(100, 999)}-{rng.randint(1000000, 9999999)}", f"ORD{rng.randint(10000, 99999)}"])
    lines = layout.format(street=street, postal=postal, city=city, region=REGION.get(city), country=rng.choice(names))
    placed = written_date(rng, random_date(rng))
    how = rng.choice(DELIVERY[delivery])
    document = rng.choice(
        [
            f"Thank you for your order {order} placed on {placed}!\n\nShipping to:\n{written_name}\n{lines}\n\n"
            f"Shipping method: {how}\nItems: 2 x USB-C cable (2 m), 1 x travel adapter",
            f"Hello, this is {written_name}. Could you please send order {order} to my new address:\n\n{lines}\n\n"
            f"I paid for {how}. My old address (Hauptstraße 1, 01067 Dresden) is no longer valid.",
            f"SHIP TO\n{written_name.upper()}\n{lines.upper()}\n\nORDER: {order}   SERVICE: {how.upper()}",
        ]
    )
    truth = {
        "order_number": order,
        "recipient": name,
        "street": street,
        "postal_code": postal,
        "city": city,
        "country": code,
        "delivery": delivery,
    }
    return document, truth


# -- calendar events -----------------------------------------------------------------------------------

HHMM = {"type": "string", "pattern": "^([01][0-9]|2[0-3]):[0-5][0-9]$", "description": "24-hour clock"}
EVENT_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "date": {"type": "string", "format": "date"},
        "start_time": HHMM,
        "end_time": HHMM,
        "kind": {"enum": ["in_person", "video_call"]},
        "location": {"type": "string", "description": "the room or place, or the video platform"},
    },
    "required": ["title", "date", "start_time", "end_time", "kind", "location"],
}
EVENTS = [
    "Quarterly budget review",
    "Design sprint kick-off",
    "Dentist appointment",
    "Team lunch",
    "Onboarding session",
    "Board meeting",
    "Parent-teacher conference",
    "Product demo",
]
PLACES = ["Room 4.12, Building B", "Café Central", "the main conference room", "Conference Room Everest", "Hall 3"]
PLATFORMS = ["Zoom", "Google Meet", "Microsoft Teams"]


def written_time(rng: random.Random, minutes: int) -> str:
    """A time of day as people write it: "2:30 pm", "14:30", "9am", "noon", "10.15 a.m."."""
    h, m = divmod(minutes, 60)
    h12 = h % 12 or 12
    ampm = "am" if h < 12 else "pm"
    forms = [f"{h:02d}:{m:02d}", f"{h12}:{m:02d} {ampm}", f"{h12}.{m:02d} {ampm[0]}.m."]
    if m == 0:
        forms += [f"{h12}{ampm}", f"{h12} o'clock" if 9 <= h <= 11 else f"{h12} {ampm.upper()}"]
        if h == 12:
            forms.append("noon")
    return rng.choice(forms)


def make_event(rng: random.Random) -> tuple[str, dict]:
    title = rng.choice(EVENTS)
    day = random_date(rng)
    start = rng.randrange(8 * 4, 18 * 4) * 15
    length = rng.choice([30, 45, 60, 90, 120])
    end = start + length
    video = rng.random() < 0.4
    place = rng.choice(PLATFORMS if video else PLACES)
    _, organiser = person(rng)
    when = written_date(rng, day)
    t0, t1 = written_time(rng, start), written_time(rng, end)
    where = f"on {place} (link to follow)" if video else f"in {place}"
    document = rng.choice(
        [
            f"Subject: {title}\n\nHi all,\n\nlet's meet for the {title.lower()} on {when}, from {t0} to {t1}, "
            f"{where}.\n\nBest,\n{organiser}",
            f"{organiser} invited you: {title}\nWhen: {when}, {t0} – {t1}\nWhere: {place}"
            + ("\nJoin online; a dial-in number is in the invite." if video else ""),
            f"Reminder: {title} is on {when}. It starts at {t0} and ends at {t1}, {where}. "
            f"(Last time it was moved to 4 pm - not this time.)",
        ]
    )
    truth = {
        "title": title,
        "date": day.isoformat(),
        "start_time": f"{start // 60:02d}:{start % 60:02d}",
        "end_time": f"{end // 60:02d}:{end % 60:02d}",
        "kind": "video_call" if video else "in_person",
        "location": place,
    }
    return document, truth


# -- contacts ------------------------------------------------------------------------------------------

JOBS = [
    "Head of Procurement",
    "Chief Data Officer",
    "Senior Software Engineer",
    "Office Manager",
    "Sales Director",
    "Research Scientist",
    "Account Executive",
]
PHONES = [("+49", "30 {} {}", 4, 4), ("+1", "({}) 555-{}", 3, 4), ("+44", "20 {} {}", 4, 4), ("+33", "1 {} {}", 4, 4)]
CONTACT_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "job_title": {"type": "string"},
        "company": {"type": "string"},
        "email": {"type": "string", "format": "email"},
        "phone": {"type": "string", "description": "international format, with the country code"},
    },
    "required": ["name", "job_title", "company", "email", "phone"],
}


def make_contact(rng: random.Random) -> tuple[str, dict]:
    name, written_name = person(rng)
    job, company = rng.choice(JOBS), rng.choice(COMPANIES)
    local = unicodedata.normalize("NFKD", name.lower()).encode("ascii", "ignore").decode().replace("'", "")
    domain = re.sub(r"[^a-z]", "", company.lower().split()[0]) + rng.choice([".com", ".de", ".co.uk", ".io"])
    email = rng.choice([local.replace(" ", "."), local[0] + local.split()[-1]]) + "@" + domain
    code, pattern, a, b = rng.choice(PHONES)
    groups = [str(rng.randint(2, 9)) + "".join(str(rng.randint(0, 9)) for _ in range(n - 1)) for n in (a, b)]
    written_phone = f"{code} {pattern.format(*groups)}"
    document = rng.choice(
        [
            f"Many thanks for your time today.\n\nBest regards,\n\n{written_name}\n{job}\n{company}\n"
            f"T: {written_phone}\nE: {email}\nOur office hours are 9:00-17:00 CET.",
            f"{written_name.upper()} | {job}\n{company}\n{email} · {written_phone}",
            f"You should talk to {written_name}, {job} at {company}. Reach them at {email} "
            f"or call {written_phone} (not the switchboard, +1 800 555 0100).",
        ]
    )
    truth = {
        "name": name,
        "job_title": job,
        "company": company,
        "email": email,
        "phone": code + re.sub(r"\D", "", pattern.format(*groups)),
    }
    return document, truth


# -- product reviews -----------------------------------------------------------------------------------

PRODUCTS = [
    "Lumio X2 desk lamp",
    "TrailMaster 45L backpack",
    "SoundNest Pro earbuds",
    "BrewCraft pour-over kettle",
    "Glide ergonomic mouse",
    "AquaPure water filter",
    "Nimbus memory-foam pillow",
]
REVIEW_SCHEMA = {
    "type": "object",
    "properties": {
        "product": {"type": "string"},
        "rating": {"type": "integer", "minimum": 1, "maximum": 5, "description": "stars"},
        "sentiment": {"enum": ["positive", "neutral", "negative"]},
        "would_recommend": {"type": "boolean"},
        "price": {"type": "number", "description": "the price paid, without the currency"},
        "reviewer": {"type": "string"},
    },
    "required": ["product", "rating", "sentiment", "would_recommend", "price", "reviewer"],
}
BODY = {
    "positive": ["Works exactly as advertised and feels well made.", "Honestly the best purchase I made this year."],
    "neutral": ["It does the job, nothing more, nothing less.", "Decent, but the finish could be better."],
    "negative": ["Stopped working after two weeks.", "Flimsy and much smaller than the photos suggest."],
}
STARS = ["one", "two", "three", "four", "five"]


def make_review(rng: random.Random) -> tuple[str, dict]:
    product = rng.choice(PRODUCTS)
    rating = rng.randint(1, 5)
    sentiment = "positive" if rating >= 4 else "neutral" if rating == 3 else "negative"
    recommend = rating >= 4 or (rating == 3 and rng.random() < 0.5)
    currency = rng.choice(["USD", "EUR", "GBP"])
    price = round(rng.uniform(9, 400), 2)
    name, written_name = person(rng)
    style = rng.randrange(12)
    stars = rng.choice(
        [
            f"{rating}/5",
            f"{rating} out of 5 stars",
            "★" * rating + "☆" * (5 - rating),
            f"{STARS[rating - 1].capitalize()} stars" if rating > 1 else "One star",
        ]
    )
    said = rng.choice(
        ["Would I recommend it? Yes.", "I'd recommend it to anyone."]
        if recommend
        else ["I would not recommend it.", "Can't recommend it, sorry."]
    )
    document = (
        f"{product} — {stars}\n\n{rng.choice(BODY[sentiment])} I paid {written_amount(price, currency, style)} "
        f"in the spring sale (the list price was {written_amount(round(price * 1.25, 2), currency, style)}). "
        f"{said}\n\n— {written_name}"
    )
    truth = {
        "product": product,
        "rating": rating,
        "sentiment": sentiment,
        "would_recommend": recommend,
        "price": price,
        "reviewer": name,
    }
    return document, truth


DOMAINS = {
    d.name: d
    for d in (
        Domain(
            "invoice",
            INVOICE_SCHEMA,
            "Extract the invoice details from this document.",
            make_invoice,
            names=("customer_name",),
        ),
        Domain(
            "shipping",
            SHIPPING_SCHEMA,
            "Extract the shipping details from this message.",
            make_shipping,
            names=("recipient",),
        ),
        Domain("event", EVENT_SCHEMA, "Extract the calendar event from this message.", make_event),
        Domain(
            "contact",
            CONTACT_SCHEMA,
            "Extract the contact details from this text.",
            make_contact,
            names=("name",),
            phones=("phone",),
        ),
        Domain(
            "review",
            REVIEW_SCHEMA,
            "Extract the review's details from this product review.",
            make_review,
            names=("reviewer",),
        ),
    )
}


def examples(per_domain: int = FULL_PER_DOMAIN, seed: int = 0, domains=None) -> list[Example]:
    """The first `per_domain` examples of each domain (all of `DOMAINS` unless `domains` names some), in
    domain order. Example i of a domain is drawn from its own `random.Random(f"{seed}:{domain}:{i}")`.
    Raises KeyError for an unknown domain name, ValueError for per_domain < 1."""
    if per_domain < 1:
        raise ValueError(f"per_domain must be >= 1, got {per_domain}")
    out = []
    for name in domains or DOMAINS:
        domain = DOMAINS[name]
        for i in range(per_domain):
            document, truth = domain.make(random.Random(f"{seed}:{name}:{i}"))
            out.append(Example(name, f"{name}-{i:03d}", document, truth))
    return out


# -- scoring -------------------------------------------------------------------------------------------

_TITLE = re.compile(r"^(?:(?:mr|mrs|ms|miss|dr|prof|sir)\.?\s+)+", re.IGNORECASE)


def normalise(value: Any, kind: str = "text") -> Any:
    """The form two values are compared in (docs/reports/quality.md, "Scoring"):

    - numbers (int/float, not bool): rounded to 2 decimals (amounts to the cent); a string is not a number;
    - booleans and None: as they are;
    - strings: Unicode NFKC, casefolded, runs of whitespace made one space, leading/trailing whitespace and
      . , ; : removed; kind "name" also drops leading titles (Mr, Mrs, Ms, Miss, Dr, Prof, Sir, with or
      without a dot); kind "phone" keeps only a leading + and the digits.
    Anything else (lists, objects) is returned unchanged and compares by equality."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return round(float(value), 2)
    if not isinstance(value, str):
        return value
    text = " ".join(unicodedata.normalize("NFKC", value).casefold().split()).strip(" .,;:")
    if kind == "name":
        text = _TITLE.sub("", text)
    elif kind == "phone":
        text = ("+" if text.startswith("+") else "") + re.sub(r"\D", "", text)
    return text


def score(domain: Domain, predicted: Any, truth: dict) -> dict[str, bool]:
    """{field: correct} for every field of `truth`. A field is correct when `predicted` is an object
    holding it and both normalise (`normalise`) to the same value with the same JSON type (a number
    written as a string is wrong). An unparsable answer (predicted None or not an object) scores every
    field wrong."""
    out = {}
    for key, expected in truth.items():
        kind = "name" if key in domain.names else "phone" if key in domain.phones else "text"
        got = predicted.get(key, _MISSING) if isinstance(predicted, dict) else _MISSING
        numbers = [isinstance(v, (int, float)) and not isinstance(v, bool) for v in (got, expected)]
        same_type = type(got) is type(expected) or all(numbers)
        out[key] = same_type and normalise(got, kind) == normalise(expected, kind)
    return out


_MISSING = object()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Print documents of the labelled extraction set.")
    parser.add_argument("--per-domain", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for ex in examples(args.per_domain, args.seed):
        print(f"== {ex.id}\n{ex.document}\n-> {json.dumps(ex.truth, ensure_ascii=False)}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
