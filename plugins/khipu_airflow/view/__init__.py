"""The Khipu view: pages and JSON API (app), inline charts, templates."""
