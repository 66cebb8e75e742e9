"""The trace UI's pages (HTML, JavaScript, CSS), shipped as package resources and served by `services.traces.web`."""
