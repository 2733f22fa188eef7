"""The Anthropic Messages dialect: `POST /v1/messages` and `count_tokens` (`routes`), its bodies
(`schemas`), mapping (`request`), reply and stream (`reply`) and error shape (`errors`)."""
