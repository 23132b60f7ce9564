"""The one exception type for problems a user can cause and fix."""


class HeadLabError(Exception):
    """A user-fixable problem. The message is one sentence that says what to do.

    The CLI prints it on one line and exits with status 2; the app shows it with st.error.
    """
