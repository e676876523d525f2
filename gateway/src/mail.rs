//! Outgoing mail over SMTP (lettre): verification codes for new accounts, and notices to an
//! address someone tried to sign up with again. Sending happens after the request's
//! transaction and never fails the request: a mail that cannot be sent is logged.

use lettre::message::Mailbox;
use lettre::transport::smtp::authentication::Credentials;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use secrecy::ExposeSecret;

use crate::config::{SmtpSecurity, SmtpSettings};

/// One mail to send.
pub struct Mail {
    pub to: String,
    pub subject: String,
    pub body: String,
}

pub struct Mailer {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
}

impl Mailer {
    pub fn new(settings: &SmtpSettings) -> anyhow::Result<Mailer> {
        let host = settings.host.as_str();
        let mut builder = match settings.security {
            SmtpSecurity::StartTls => AsyncSmtpTransport::<Tokio1Executor>::starttls_relay(host)?,
            SmtpSecurity::Tls => AsyncSmtpTransport::<Tokio1Executor>::relay(host)?,
            // Only for a relay on this machine or a test sink.
            SmtpSecurity::None => AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(host),
        }
        .port(settings.port)
        .timeout(Some(std::time::Duration::from_secs(10)));
        if let (Some(username), Some(password)) = (&settings.username, &settings.password) {
            builder = builder.credentials(Credentials::new(
                username.clone(),
                password.expose_secret().to_owned(),
            ));
        }
        let from = settings
            .from
            .parse()
            .map_err(|error| anyhow::anyhow!("smtp.from `{}`: {error}", settings.from))?;
        Ok(Mailer {
            transport: builder.build(),
            from,
        })
    }

    /// Sends `mail`; failures are logged, not returned.
    pub async fn send(&self, mail: Mail) {
        let to: Mailbox = match mail.to.parse() {
            Ok(to) => to,
            Err(error) => {
                tracing::warn!(error = %error, "a mail's recipient does not parse");
                return;
            }
        };
        let message = match Message::builder()
            .from(self.from.clone())
            .to(to)
            .subject(mail.subject)
            .body(mail.body)
        {
            Ok(message) => message,
            Err(error) => {
                tracing::error!(error = %error, "building a mail failed");
                return;
            }
        };
        match self.transport.send(message).await {
            Ok(_) => metrics::counter!("sandbase_mail_sent_total").increment(1),
            Err(error) => {
                metrics::counter!("sandbase_mail_failed_total").increment(1);
                tracing::error!(error = %error, "sending a mail failed");
            }
        }
    }
}
