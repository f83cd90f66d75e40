"""The Manage page: sign-in, sessions and the page's assets, served by the daemon."""
